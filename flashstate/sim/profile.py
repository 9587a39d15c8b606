"""Hardware profiles: one JSON file per (device, model) — memory, engine flags and the performance model.

    {"schema": "flashstate.sim.profile/1", "name", "device", "model": preset name or HF model directory,
     "dtype", "memory": {"cache_bytes": KV + state budget, "host_bytes": host memory, recorded (the
                simulated host tier is sized by --host-cache-bytes)},
     "engine_args": ["--max-num-seqs", "64", ...]   `flashstate serve` flags, before --serve-args,
     "prefill": {"a", "b", "points": [[tokens, seconds], ...], "step_s"}   C(n) = a·n + b·n²; a, b fitted
                from the points when absent; step_s (optional, 0): the fixed cost of a step that prefills
                anything (the eager forward's host work, which decode steps replay from CUDA graphs);
                graphed_step_s (optional): that cost for a mixed step run as a CUDA graph
                (--mixed-step-graphs, for the steps engine/mixed_graphs.py's buckets take);
                graphed_max_exports (optional): the most state exports such a step held on the engine
                the profile was measured on (absent: the engine's own, step_shapes.MAX_EXPORTS; 0 for
                an engine whose buckets took no step that exported),
     "decode": {"base_s", "per_seq_s", "per_token_s"}   one decode step of B sequences holding T context
                tokens in all: base_s + per_seq_s·B + per_token_s·T,
     "request": {"overhead_s", "overhead_per_token_s"}   (optional, 0) the time a request spends outside
                the engine between the client's send and its first token (HTTP, the prompt's JSON, the
                server's event loop): overhead_s + overhead_per_token_s · prompt tokens when it is
                alone; the simulated request reaches its engine that long after it is sent (in chat
                mode, its per-token part shared with the other chat prompts its server prepares at
                once: sim/shared_cpu.py); "chat_overhead_s",
                "chat_overhead_per_token_s" (optional, both or neither): the same for a chat-mode replay,
                whose server also renders the chat template and tokenizes the text (the token-mode terms
                where absent),
     "chat": {"header_tokens", "per_message_tokens", "text_share", "engine_per_token_s",
              "engine_per_admit_s"}   (optional, all 0)
                a chat-mode replay as the server sees it: its chat template adds header_tokens to a prompt
                (system and tool definitions framed, the first turn's role markers), per_message_tokens to
                each later message, and text_share more tokens per token of text (words read back by the
                server's tokenizer); and rendering and tokenizing a chat prompt takes engine_per_token_s of
                the engine thread per prompt token (the server's threads share one interpreter), which
                the step after the request reaches its engine waits out; and the step that first runs a
                chat request (admits it, or lands its restore) takes engine_per_admit_s more than the
                token-mode step model prices it,
     "host": {"calls_in_steps"}   (optional, false) true where the step model was fitted on a run with a host
                tier with the engine thread's time in the tier's calls left in its steps (sim/host.py
                charges that time to the steps otherwise; `fit-profile` takes it out since 2026-12-04);
                "lookup_s_per_token", "restore_s_per_token", "write_back_s", "load_s_per_token",
                "read_ahead_s_per_token" (optional, HostCallCosts' defaults, measured on the 2B preset): what
                those calls cost the engine thread, and a read-ahead's time on a fetch thread; "earlier"
                (optional): [{"until": UTC time, any of those costs}, ...], what they cost an engine built
                before `until` (a replay of a run recorded then: `simulate --engine-as-of`),
     "events": {"admit_s", "finish_s"}   (optional, 0) the engine thread's time per request a step admits
                (its cache hit matched, blocks and slot taken, checkpoints planned) and per request a step
                finishes (its checkpoints committed, its blocks released, its output closed),
     "noise": {"prefill_sd", "decode_sd"}   (optional, 0) how far a measured step's time strays from the
                model's price: the standard deviation of log(measured / modelled) over steps with prefill
                and over pure-decode steps (StepNoise); the simulator draws each step's time around its
                price with that spread, since a queue's tail grows with the variance of its service times,
     "provenance": where the numbers come from}

A step of the engine takes the prefill time of its chunks (a chunk of n tokens resuming at depth p costs
C(p + n) − C(p)), plus step_s (graphed_step_s for a graphed one) when it prefills anything, plus, when it
decodes, the decode step time of its decoding sequences, plus its events' costs; with noise, that price
times a log-normal factor of mean 1.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flashstate.cache.cost import PrefillCost
from flashstate.engine.step_shapes import MAX_EXPORTS

PROFILE_SCHEMA = "flashstate.sim.profile/1"
PROFILES_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "h200-qwen3-next-2b"


class ProfileError(ValueError):
    """A malformed profile; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class DecodeModel:
    base_s: float
    per_seq_s: float
    per_token_s: float

    def __call__(self, num_seqs: int, context_tokens: int) -> float:
        if num_seqs == 0:
            return 0.0
        return self.base_s + self.per_seq_s * num_seqs + self.per_token_s * context_tokens


@dataclass(frozen=True, slots=True)
class RequestOverhead:
    base_s: float = 0.0
    per_token_s: float = 0.0

    def __call__(self, prompt_tokens: int) -> float:
        return self.base_s + self.per_token_s * prompt_tokens


@dataclass(frozen=True, slots=True)
class ChatCosts:
    """What a chat-mode prompt costs beyond its token-mode replay (the profile's "chat" section)."""

    header_tokens: int = 0
    per_message_tokens: float = 0.0
    text_share: float = 0.0
    engine_per_token_s: float = 0.0
    engine_per_admit_s: float = 0.0  # on the step that first runs the request

    def template_tokens(self, text_tokens: int, first: bool) -> int:
        """Tokens the template adds to a message of `text_tokens` (`first`: the prompt's first)."""
        fixed = self.header_tokens if first else self.per_message_tokens
        return int(fixed + self.text_share * text_tokens)


@dataclass(frozen=True, slots=True)
class HostCallCosts:
    """The engine thread's seconds in the host tier's calls (the profile's "host" section). Defaults: the
    qwen3-next-2b preset's, from `host_cache_engine_seconds_total` of two headline-flags runs on the H200
    (chat and token mode, 2026-12-04, benchmarks/RESULTS.md): lookups 0.12–0.19 µs per prompt token per
    request (two lookups each), restores 1.51–1.54 µs per restored token (`start_restore`'s 1.27–1.35, which
    reads and verifies the objects when the fetch is inline, and `load`'s 0.19–0.24, which copies them into
    the blocks), write-backs 3.2–3.9 ms a state. A restore whose objects were read ahead while its request
    waited (cache/host/prefetch.py) costs the engine thread `load`'s part and what is left of the read when it
    is admitted. read_ahead_s_per_token is not the engine thread's: how long a read-ahead takes on a fetch
    thread beside the busy engine thread, per token read (1.25–1.68 µs on the tune half's three read-ahead
    card runs of 2026-12-05 at 1024- and 4096-token chunks alike, against ~0.54 µs read inline)."""

    lookup_s_per_token: float = 7.5e-8
    restore_s_per_token: float = 1.5e-6
    write_back_s: float = 3.5e-3
    load_s_per_token: float = 2.1e-7
    read_ahead_s_per_token: float = 1.5e-6

    @property
    def read_s_per_token(self) -> float:
        """An inline restore's read and verify (`start_restore`), per token: the restore less its copy-in."""
        return max(0.0, self.restore_s_per_token - self.load_s_per_token)


MEASURED_2B_HOST_CALLS = HostCallCosts()


@dataclass(frozen=True, slots=True)
class StepEvents:
    """The engine thread's seconds per request a step admits and per request it finishes (the profile's
    "events" section), on top of the step's shape."""

    admit_s: float = 0.0
    finish_s: float = 0.0

    def __call__(self, admitted: int, finished: int) -> float:
        return self.admit_s * admitted + self.finish_s * finished


NO_STEP_EVENTS = StepEvents()


@dataclass(frozen=True, slots=True)
class StepNoise:
    """How far a step's time strays from its modelled price (the profile's "noise" section): each step takes
    its price times exp(N(−sd²/2, sd)), a factor of mean 1, with the sd of its kind. A deterministic
    simulator serves every step at its mean and so under-states the queue's tail (Kingman: the wait grows
    with the service times' variance); fit-profile measures the spread on the card's steps."""

    prefill_sd: float = 0.0  # steps with prefill tokens
    decode_sd: float = 0.0  # pure-decode steps

    def factor(self, rng: random.Random, decode: bool) -> float:
        sd = self.decode_sd if decode else self.prefill_sd
        return math.exp(rng.gauss(-sd * sd / 2, sd)) if sd > 0 else 1.0


NO_STEP_NOISE = StepNoise()


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    device: str
    model: str
    dtype: str
    cache_bytes: int
    host_bytes: int | None
    engine_args: tuple[str, ...]
    prefill: PrefillCost
    decode: DecodeModel
    provenance: str
    path: str
    prefill_step_s: float = 0.0
    graphed_step_s: float | None = None  # None: graphed mixed steps not measured for this profile
    graphed_max_exports: int = MAX_EXPORTS
    request_overhead: RequestOverhead = RequestOverhead()
    host_calls_in_steps: bool = False
    chat_request_overhead: RequestOverhead | None = None
    chat: ChatCosts = ChatCosts()
    host_calls: HostCallCosts = MEASURED_2B_HOST_CALLS
    events: StepEvents = NO_STEP_EVENTS
    noise: StepNoise = NO_STEP_NOISE
    # the engine's own cost model (its calibration), where it is not `prefill`: a profile whose step times
    # are scaled keeps the measured one, so only time moves
    engine_cost: PrefillCost | None = None
    step_cost_scale: float = 1.0
    # (until, costs), ascending: the host tier's call costs of an engine built before `until`
    earlier_host_calls: tuple[tuple[datetime, HostCallCosts], ...] = ()

    def as_of(self, when: datetime) -> Profile:
        """This profile for an engine as it was at `when`: the host tier's call costs of the first `earlier`
        entry it precedes, else today's."""
        for until, calls in self.earlier_host_calls:
            if when < until:
                return replace(self, host_calls=calls)
        return self

    def with_step_costs_scaled(self, factor: float) -> Profile:
        """This profile with every step-time term (prefill, the fixed costs of a prefill step, decode, the
        steps' events) multiplied by `factor`; the engine's cost model, the request overhead and the host
        tier's call costs unchanged. For how far a result moves with a few percent of step cost."""
        if not (factor > 0 and math.isfinite(factor)):
            raise ProfileError(f"--step-cost-scale: expected a positive number, got {factor!r}")
        d = self.decode
        return replace(
            self,
            prefill=PrefillCost(self.prefill.a * factor, self.prefill.b * factor, self.prefill.source),
            decode=DecodeModel(d.base_s * factor, d.per_seq_s * factor, d.per_token_s * factor),
            prefill_step_s=self.prefill_step_s * factor,
            graphed_step_s=None if self.graphed_step_s is None else self.graphed_step_s * factor,
            events=StepEvents(self.events.admit_s * factor, self.events.finish_s * factor),
            engine_cost=self.engine_cost or self.prefill,
            step_cost_scale=self.step_cost_scale * factor,
        )

    def request_overhead_for(self, mode: str) -> RequestOverhead:
        """The request overhead of a replay in `mode` ("completions" or "chat")."""
        if mode == "chat" and self.chat_request_overhead is not None:
            return self.chat_request_overhead
        return self.request_overhead

    def serve_args(self) -> list[str]:
        """The engine flags this profile stands for (later flags override them)."""
        return ["--kv-cache-memory-bytes", str(self.cache_bytes), *self.engine_args]

    def describe(self) -> dict[str, Any]:
        return {
            "profile": self.name,
            "profile_path": self.path,
            "device": self.device,
            "model": self.model,
            "prefill_a": self.prefill.a,
            "prefill_b": self.prefill.b,
            "prefill_step_s": self.prefill_step_s,
            "graphed_step_s": self.graphed_step_s,
            "graphed_max_exports": self.graphed_max_exports,
            "decode": {
                "base_s": self.decode.base_s,
                "per_seq_s": self.decode.per_seq_s,
                "per_token_s": self.decode.per_token_s,
            },
            "request_overhead": {
                "base_s": self.request_overhead.base_s,
                "per_token_s": self.request_overhead.per_token_s,
            },
            "chat_request_overhead": None
            if (c := self.chat_request_overhead) is None
            else {"base_s": c.base_s, "per_token_s": c.per_token_s},
            "host_calls_in_steps": self.host_calls_in_steps,
            "host_calls": asdict(self.host_calls),
            "events": asdict(self.events),
            "noise": asdict(self.noise),
            "step_cost_scale": self.step_cost_scale,
            "chat": asdict(self.chat),
            "provenance": self.provenance,
        }


def _num(obj: dict, key: str, where: str, required: bool = True) -> float | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ProfileError(f"{where}.{key}: expected a non-negative number, got {value!r}")
    return float(value)


def utc_time(text: object, where: str) -> datetime:
    """An ISO 8601 time as results stamp `created` (2026-12-05T04:24:40+00:00); without an offset, UTC."""
    try:
        when = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        when = None
    if when is None:
        raise ProfileError(
            f"{where}: expected an ISO 8601 time such as 2026-12-05T04:24:40+00:00, got {text!r}"
        )
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _host_calls(doc: dict, where: str) -> HostCallCosts:
    """HostCallCosts from the costs `doc` names (HostCallCosts' defaults for the rest)."""
    names = [f.name for f in fields(HostCallCosts)]
    return HostCallCosts(**{k: v for k in names if (v := _num(doc, k, where, False)) is not None})


def _section(doc: dict, key: str, cls: type, where: str) -> list[float]:
    """An optional section of non-negative numbers named by `cls`'s fields, in their order (0 where absent);
    ProfileError naming the section for anything else in it."""
    section = doc.get(key) or {}
    if not isinstance(section, dict):
        raise ProfileError(f"{where}.{key}: expected an object")
    names = [f.name for f in fields(cls)]
    if unknown := sorted(set(section) - set(names)):
        known = ", ".join(names)
        raise ProfileError(f"{where}.{key}: unknown field(s) {', '.join(unknown)} (known: {known})")
    return [_num(section, k, f"{where}.{key}", False) or 0.0 for k in names]


def _prefill(doc: dict, where: str) -> PrefillCost:
    if not isinstance(doc, dict):
        raise ProfileError(f"{where}: expected an object")
    a, b = _num(doc, "a", where, False), _num(doc, "b", where, False)
    if a is not None and b is not None:
        return PrefillCost(a, b, f"profile:{where}")
    points = doc.get("points")
    try:
        lengths, seconds = zip(*points, strict=True) if points else ((), ())
        return PrefillCost.fit(list(lengths), list(seconds), f"profile:{where} (fitted)")
    except (TypeError, ValueError) as e:
        raise ProfileError(f"{where}: needs a and b, or two or more [tokens, seconds] points ({e})") from e


def load_profile(name_or_path: str | None = None) -> Profile:
    """A profile by path, or by name from flashstate/sim/profiles/ (default: the H200 one)."""
    name_or_path = name_or_path or DEFAULT_PROFILE
    path = Path(name_or_path)
    if not path.exists():
        path = PROFILES_DIR / f"{name_or_path}.json"
    if not path.exists():
        shipped = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.json")))
        raise ProfileError(f"profile {name_or_path!r}: no such file, and not a shipped profile ({shipped})")
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileError(f"{path}: not readable JSON: {e}") from e
    where = str(path)
    if not isinstance(doc, dict) or doc.get("schema") != PROFILE_SCHEMA:
        raise ProfileError(f"{where}.schema: expected {PROFILE_SCHEMA!r}")
    memory, decode = doc.get("memory") or {}, doc.get("decode") or {}
    args = doc.get("engine_args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ProfileError(f"{where}.engine_args: expected a list of strings")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise ProfileError(f"{where}.model: expected a preset name or a model directory")
    host = _num(memory, "host_bytes", f"{where}.memory", False)
    prefill = _prefill(doc.get("prefill"), f"{where}.prefill")  # raises unless doc["prefill"] is an object
    exports = _num(doc["prefill"], "graphed_max_exports", f"{where}.prefill", False)
    request = doc.get("request") or {}
    if not isinstance(request, dict):
        raise ProfileError(f"{where}.request: expected an object")
    overhead = RequestOverhead(
        *(_num(request, k, f"{where}.request", False) or 0.0 for k in ("overhead_s", "overhead_per_token_s"))
    )
    chat_keys = ("chat_overhead_s", "chat_overhead_per_token_s")
    chat = [_num(request, k, f"{where}.request", False) for k in chat_keys]
    if (chat[0] is None) != (chat[1] is None):
        raise ProfileError(f"{where}.request: chat_overhead_s and chat_overhead_per_token_s go together")
    header, per_message, share, engine, admit = _section(doc, "chat", ChatCosts, where)
    host_doc = doc.get("host") or {}
    if not isinstance(host_doc, dict) or not isinstance(host_doc.get("calls_in_steps", False), bool):
        raise ProfileError(f"{where}.host: expected an object with a boolean calls_in_steps")
    call_costs = [f.name for f in fields(HostCallCosts)]
    if unknown := sorted(set(host_doc) - {"calls_in_steps", "earlier", *call_costs}):
        known = ", ".join(["calls_in_steps", "earlier", *call_costs])
        raise ProfileError(f"{where}.host: unknown field(s) {', '.join(unknown)} (known: {known})")
    host_calls = _host_calls(host_doc, f"{where}.host")
    earlier = host_doc.get("earlier") or []
    if not isinstance(earlier, list) or not all(
        isinstance(e, dict) and "until" in e and not set(e) - {"until", *call_costs} for e in earlier
    ):
        raise ProfileError(
            f"{where}.host.earlier: expected a list of objects with an `until` time and call costs "
            f"({', '.join(call_costs)})"
        )
    at = [f"{where}.host.earlier[{i}]" for i in range(len(earlier))]
    earlier_host_calls = tuple(
        sorted(
            (
                (utc_time(e["until"], f"{w}.until"), _host_calls(e, w))
                for e, w in zip(earlier, at, strict=True)
            ),
            key=lambda entry: entry[0],
        )
    )
    events = StepEvents(*_section(doc, "events", StepEvents, where))
    noise = StepNoise(*_section(doc, "noise", StepNoise, where))
    return Profile(
        name=str(doc.get("name") or path.stem),
        device=str(doc.get("device", "")),
        model=model,
        dtype=str(doc.get("dtype", "bfloat16")),
        cache_bytes=int(_num(memory, "cache_bytes", f"{where}.memory")),
        host_bytes=None if host is None else int(host),
        engine_args=tuple(args),
        prefill=prefill,
        decode=DecodeModel(
            *(_num(decode, k, f"{where}.decode") for k in ("base_s", "per_seq_s", "per_token_s"))
        ),
        provenance=str(doc.get("provenance", "")),
        path=where,
        prefill_step_s=_num(doc["prefill"], "step_s", f"{where}.prefill", False) or 0.0,
        graphed_step_s=_num(doc["prefill"], "graphed_step_s", f"{where}.prefill", False),
        graphed_max_exports=MAX_EXPORTS if exports is None else int(exports),
        request_overhead=overhead,
        host_calls_in_steps=host_doc.get("calls_in_steps", False),
        host_calls=host_calls,
        earlier_host_calls=earlier_host_calls,
        events=events,
        noise=noise,
        chat_request_overhead=None if chat[0] is None else RequestOverhead(*chat),
        chat=ChatCosts(int(header), per_message, share, engine, admit),
    )
