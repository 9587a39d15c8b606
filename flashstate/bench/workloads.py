"""Agent workloads: `Session`s of `Request`s, loaded from traces.

Two trace formats:

- AgentX / "Weka" Claude-Code traces: one JSON object per session (`.json` or `.json.gz`, a file or a
  directory of them). `requests` holds the agent's calls in order; each has `t` (seconds since the
  session started), `in`, `out`, `hash_ids` (one id per *full* `block_size`-token block of the prompt),
  `think_time` (seconds between the previous response and this request), `api_time`, `stop`,
  `input_types` / `output_types` (what the prompt's new part and the answer held: "text", "tool_result";
  "text", "thinking", "tool_use"; chat mode shapes its messages by them). An entry
  with `type: "subagent"` is a sub-agent with its own `requests`; its `t` is when it returned, and
  `duration_ms` how long it ran. Sub-agents listed between two parent requests were launched when the
  first one finished and joined before the second. `hash_id_scope: "local"` means ids are private to
  the file (sub-agents share the parent's id space).
- Mooncake-style JSONL: one request per line with `timestamp` (ms), `input_length`, `output_length`,
  `hash_ids` (default 512-token blocks) and optionally `session_id` and `delay` (ms); lines sharing a
  `session_id` are the turns of one closed-loop session, lines without one are one-turn sessions.

Replay semantics (what `replay.py` does with a `Session`): send `requests[0]` after its `think_time`;
when a request finishes, launch its `subagents` (concurrently, each a `Session`), join them, wait the
next request's `think_time`, send it; `Session.subagents` are launched at the session's start.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AGENTX_BLOCK_SIZE = 64
MOONCAKE_BLOCK_SIZE = 512


class WorkloadError(ValueError):
    """A malformed trace; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Request:
    input_len: int  # prompt tokens as recorded
    output_len: int  # output tokens as recorded (replayed as max_tokens with ignore_eos)
    hash_ids: tuple[int, ...]  # one id per full block of the prompt; same id → same block content
    think_time: float = 0.0  # seconds to wait before sending, after the previous step (and sub-agents)
    subagents: tuple[Session, ...] = ()  # launched when this request finishes, joined before the next
    stop: str | None = None
    input_types: tuple[str, ...] = ()  # AgentX: what the prompt's new part is ("text", "tool_result")
    output_types: tuple[str, ...] = ()  # AgentX: what the answer held ("text", "thinking", "tool_use")


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    requests: tuple[Request, ...]
    block_size: int  # tokens per hash block
    scope: str = ""  # namespace of hash_ids ("" = global: equal ids are equal blocks across sessions)
    subagents: tuple[Session, ...] = ()  # launched when the session starts
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def walk(self) -> Iterable[tuple[int, Session]]:
        """This session and every sub-agent below it, with their depth (0 = this one)."""
        stack = [(0, self)]
        while stack:
            depth, s = stack.pop()
            yield depth, s
            children = list(s.subagents) + [a for r in s.requests for a in r.subagents]
            stack.extend((depth + 1, c) for c in reversed(children))


# ---------------------------------------------------------------------------------------------------
# field access with errors that name the file and the field


def _get(obj: dict, key: str, where: str, kind: type | tuple[type, ...], *, required: bool = True) -> Any:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj or obj[key] is None:
        if required:
            raise WorkloadError(f"{where}.{key}: missing")
        return None
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise WorkloadError(f"{where}.{key}: expected {names}, got {value!r:.60}")
    if isinstance(value, (int, float)) and (value < 0 or not math.isfinite(value)):
        raise WorkloadError(f"{where}.{key}: expected a finite non-negative number, got {value!r}")
    return value


def _hash_ids(obj: dict, key: str, where: str) -> tuple[int, ...]:
    ids = _get(obj, key, where, list)
    for i, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, int):
            raise WorkloadError(f"{where}.{key}[{i}]: expected int, got {h!r:.60}")
    return tuple(ids)


def _names(obj: dict, key: str, where: str) -> tuple[str, ...]:
    names = _get(obj, key, where, list, required=False) or []
    for i, n in enumerate(names):
        if not isinstance(n, str):
            raise WorkloadError(f"{where}.{key}[{i}]: expected str, got {n!r:.60}")
    return tuple(names)


def _check_blocks(hash_ids: tuple[int, ...], input_len: int, block_size: int, where: str) -> None:
    if len(hash_ids) > math.ceil(input_len / block_size):
        raise WorkloadError(
            f"{where}.hash_ids: {len(hash_ids)} blocks of {block_size} tokens for {input_len} input tokens"
        )


def _read_json(path: Path) -> Any:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WorkloadError(f"{path}: not readable JSON: {e}") from e


# ---------------------------------------------------------------------------------------------------
# AgentX / Weka


def _agentx_requests(
    entries: Any, where: str, sid: str, scope: str, block_size: int, first_delay: float
) -> tuple[tuple[Request, ...], tuple[Session, ...]]:
    """Parse one `requests` list; returns the requests and the sub-agents launched at the start."""
    if not isinstance(entries, list) or not entries:
        raise WorkloadError(f"{where}: expected a non-empty list")
    parsed: list[dict] = []  # Request fields, sub-agents appended while the next entries are read
    leading: list[Session] = []
    group: list[tuple[Session, float]] = []  # sub-agents since the last request, with their return time
    prev_t = prev_api = None
    for i, e in enumerate(entries):
        w = f"{where}[{i}]"
        if _get(e, "type", w, str, required=False) == "subagent":
            sub_where = f"{w}.requests"
            t_done = float(_get(e, "t", w, (int, float), required=False) or 0.0)
            duration = float(_get(e, "duration_ms", w, (int, float), required=False) or 0.0) / 1000
            delay = 0.0
            if prev_t is not None and duration > 0:
                delay = max(0.0, t_done - duration - (prev_t + (prev_api or 0.0)))
            agent_id = _get(e, "agent_id", w, str, required=False) or f"sub{i}"
            reqs, subs = _agentx_requests(
                e.get("requests"), sub_where, f"{sid}/{agent_id}", scope, block_size, delay
            )
            meta = {k: e[k] for k in ("subagent_type", "models", "system_tokens", "tool_tokens") if k in e}
            sub = Session(f"{sid}/{agent_id}", reqs, block_size, scope, subs, meta)
            (parsed[-1]["subagents"] if parsed else leading).append(sub)
            group.append((sub, t_done))
            continue
        t = float(_get(e, "t", w, (int, float)))
        input_len = _get(e, "in", w, int)
        output_len = _get(e, "out", w, int)
        hash_ids = _hash_ids(e, "hash_ids", w)
        _check_blocks(hash_ids, input_len, block_size, w)
        recorded = _get(e, "think_time", w, (int, float), required=False)
        if not parsed:
            think = first_delay
        elif group:  # the recorded gap includes the sub-agents' run: keep only the part after they joined
            think = max(0.0, t - max(done for _, done in group))
            if recorded is not None:
                think = min(think, float(recorded))
        elif recorded is not None:
            think = float(recorded)
        else:
            think = max(0.0, t - prev_t - (prev_api or 0.0))
        parsed.append(
            dict(
                input_len=input_len,
                output_len=output_len,
                hash_ids=hash_ids,
                think_time=think,
                subagents=[],
                stop=_get(e, "stop", w, str, required=False),
                input_types=_names(e, "input_types", w),
                output_types=_names(e, "output_types", w),
            )
        )
        group = []
        prev_t, prev_api = t, _get(e, "api_time", w, (int, float), required=False)
    if not parsed:
        raise WorkloadError(f"{where}: no requests, only sub-agents")
    reqs = tuple(Request(**{**p, "subagents": tuple(p["subagents"])}) for p in parsed)
    return reqs, tuple(leading)


def parse_agentx(data: Any, where: str, default_id: str) -> Session:
    """One AgentX session object → `Session` (`where` prefixes error messages)."""
    if not isinstance(data, dict):
        raise WorkloadError(f"{where}: expected a session object, got {type(data).__name__}")
    sid = str(_get(data, "id", where, (str, int), required=False) or default_id)
    block_size = _get(data, "block_size", where, int, required=False) or AGENTX_BLOCK_SIZE
    if block_size < 1:
        raise WorkloadError(f"{where}.block_size: must be >= 1")
    scope_kind = _get(data, "hash_id_scope", where, str, required=False) or "local"
    if scope_kind not in ("local", "global"):
        raise WorkloadError(f"{where}.hash_id_scope: expected 'local' or 'global', got {scope_kind!r}")
    scope = sid if scope_kind == "local" else ""
    reqs, leading = _agentx_requests(data.get("requests"), f"{where}: requests", sid, scope, block_size, 0.0)
    meta = {k: data[k] for k in ("models", "system_tokens", "tool_tokens") if k in data}
    return Session(sid, reqs, block_size, scope, leading, meta)


def _trace_files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith(suffixes))
        if not files:
            raise WorkloadError(f"{path}: no {' or '.join(suffixes)} files")
        return files
    if not path.exists():
        raise WorkloadError(f"{path}: no such file or directory")
    return [path]


def load_agentx(path: str | Path, limit: int | None = None) -> list[Session]:
    """Sessions from an AgentX file or a directory of them (sorted by name; at most `limit` files)."""
    sessions = []
    for f in _trace_files(Path(path), (".json", ".json.gz"))[:limit]:
        data = _read_json(f)
        stem = f.name.removesuffix(".gz").removesuffix(".json")
        objs = data if isinstance(data, list) else [data]
        for k, obj in enumerate(objs):
            where = f"{f}" if len(objs) == 1 else f"{f}: [{k}]"
            sessions.append(parse_agentx(obj, where, stem if len(objs) == 1 else f"{stem}-{k}"))
    return sessions


# ---------------------------------------------------------------------------------------------------
# Mooncake JSONL

_ALIASES = {
    "input_length": ("input_length", "input_tokens"),
    "output_length": ("output_length", "output_tokens"),
    "timestamp": ("timestamp", "created_time"),
    "delay": ("delay", "delay_ms"),
}


def _alias(row: dict, key: str) -> Any:
    return next((row[k] for k in _ALIASES[key] if row.get(k) is not None), None)


def load_mooncake(
    path: str | Path, block_size: int = MOONCAKE_BLOCK_SIZE, limit: int | None = None
) -> list[Session]:
    """Sessions from a Mooncake-style JSONL file (or a directory of `.jsonl` files).

    A turn's think time is its `delay` (ms), else the gap between its `timestamp` and the previous turn's
    (which includes the previous turn's service time: an upper bound)."""
    sessions: dict[str, list[tuple[float | None, Request]]] = {}
    for f in _trace_files(Path(path), (".jsonl", ".jsonl.gz")):
        opener = gzip.open if f.name.endswith(".gz") else open
        try:
            with opener(f, "rt", encoding="utf-8") as fh:
                lines = fh.readlines()
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise WorkloadError(f"{f}: not readable: {e}") from e
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            w = f"{f}: line {n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise WorkloadError(f"{w}: not JSON: {e}") from e
            norm = {k: _alias(row, k) for k in _ALIASES} if isinstance(row, dict) else row
            input_len = _get(norm, "input_length", w, int)
            output_len = _get(norm, "output_length", w, int)
            ts = _get(norm, "timestamp", w, (int, float), required=False)
            delay = _get(norm, "delay", w, (int, float), required=False)
            hash_ids = _hash_ids(row, "hash_ids", w)
            _check_blocks(hash_ids, input_len, block_size, w)
            sid = row.get("session_id")
            key = f"{f.name}:{n}" if sid is None else str(sid)
            turns = sessions.setdefault(key, [])
            if delay is not None:
                think = float(delay) / 1000
            elif turns and ts is not None and turns[-1][0] is not None:
                think = max(0.0, (float(ts) - turns[-1][0]) / 1000)
            else:
                think = 0.0
            turns.append((None if ts is None else float(ts), Request(input_len, output_len, hash_ids, think)))
        if limit is not None and len(sessions) >= limit:
            break
    if not sessions:
        raise WorkloadError(f"{path}: no requests")
    out = [Session(sid, tuple(r for _, r in turns), block_size, "") for sid, turns in sessions.items()]
    return out[:limit]


def trace_format(path: str | Path, fmt: str = "auto") -> str:
    """`agentx` or `mooncake`; `auto` decides by file suffix (`.jsonl*` is Mooncake)."""
    if fmt == "auto":
        p = Path(path)
        names = [q.name for q in p.iterdir()] if p.is_dir() else [p.name]
        return "mooncake" if any(n.endswith((".jsonl", ".jsonl.gz")) for n in names) else "agentx"
    if fmt not in ("agentx", "mooncake"):
        raise WorkloadError(f"unknown trace format {fmt!r} (agentx, mooncake, auto)")
    return fmt


TRACE_SPLITS = ("tune", "validate")


def load_workload(
    path: str | Path,
    fmt: str = "auto",
    block_size: int | None = None,
    limit: int | None = None,
    split: str | None = None,
) -> list[Session]:
    """Load a trace in format `fmt` (`agentx`, `mooncake`, `auto`); `split` keeps one half of it by a fixed
    rule (see `split_sessions`)."""
    if not Path(path).exists():
        raise WorkloadError(f"{path}: no such file or directory")
    if trace_format(path, fmt) == "agentx":
        sessions = load_agentx(path, limit)
    else:
        sessions = load_mooncake(path, block_size or MOONCAKE_BLOCK_SIZE, limit)
    return sessions if split is None else split_sessions(sessions, split)


def split_sessions(sessions: list[Session], split: str) -> list[Session]:
    """The tuning half (`tune`: sessions at even positions in load order, i.e. sorted by trace file name)
    or the validation half (`validate`: odd positions). Every knob is set on the first and checked on the
    second; the rule depends on nothing a run measures."""
    if split not in TRACE_SPLITS:
        raise WorkloadError(f"trace split must be one of {', '.join(TRACE_SPLITS)}, got {split!r}")
    half = sessions[TRACE_SPLITS.index(split) :: 2]
    if not half:
        raise WorkloadError(f"the {split} half of {len(sessions)} session(s) is empty")
    return half
