"""Synthetic coding agents whose statistics are fitted to real Claude-Code traces.

`observe(sessions)` measures a trace set (per-turn samples); `fit(sessions)` turns the samples into a
`SyntheticConfig` (log-normals from median and inter-quartile range, deciles where a log-normal does
not fit); `generate(config, n, seed)` draws sessions in the AgentX shape (`workloads.Session`).
`DEFAULT` is `fit()` of the 166 sessions in `shared/traces/claude-code` (tests check it still is).

An agent: a prefix shared by every session (tool definitions + system prompt: same hash ids in every
session), a first context, then turns; a turn re-sends the previous prompt + output plus new tokens
(tool results), or, with `rewrite_prob`, keeps only part of the context (compaction, edits) and adds
new tokens after it. Think time follows a tool call (short) or a user turn (long). After a turn, with
`subagent_prob`, a group of sub-agents (their own shared prefix and shape) runs and joins.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from flashstate.bench.prompts import common_prefix
from flashstate.bench.workloads import Request, Session

_PROBS = np.linspace(0.0, 100.0, 11)  # deciles, with the minimum and the maximum


@dataclass(frozen=True, slots=True)
class Deciles:
    """An empirical distribution: its values at 0, 10, ..., 100 %; sampling interpolates between them
    (geometrically where both ends are positive: the traces' quantities are heavy-tailed)."""

    points: tuple[float, ...]

    def sample(self, rng: random.Random) -> float:
        x = rng.random() * (len(self.points) - 1)
        i = min(int(x), len(self.points) - 2)
        lo, hi, f = self.points[i], self.points[i + 1], x - i
        return lo * (hi / lo) ** f if lo > 0 and hi > 0 else lo + (hi - lo) * f

    @classmethod
    def fit(cls, values: list[float]) -> Deciles:
        return cls(tuple(round(float(q), 3) for q in np.percentile(np.asarray(values, float), _PROBS)))


@dataclass(frozen=True, slots=True)
class AgentShape:
    prefix_tokens: int  # shared by all sessions of this kind
    first_context: Deciles  # first prompt minus the shared prefix
    turns: Deciles
    new_tokens: Deciles  # tokens a turn adds after the previous prompt + output
    output: Deciles
    think_tool: Deciles  # seconds after a tool call
    think_user: Deciles  # seconds after a user turn (end_turn, interrupted)
    user_turn_prob: float
    rewrite_prob: float  # a turn keeps only part of the previous prompt
    rewrite_keep: Deciles  # fraction of the previous prompt kept
    rewrite_new: Deciles  # tokens after the kept part of a rewrite
    peak_context: Deciles  # a session's largest prompt + output: its context window; beyond it, compact
    start_delay: float = 0.0  # seconds from launch to the first request (sub-agents)


# fit(shared/traces/claude-code), 166 sessions; sub-agent fields with < 4 samples are set by hand (#).
DEFAULT_MAIN = AgentShape(
    prefix_tokens=15172,
    first_context=Deciles(
        (129.0, 955.0, 3789.0, 6178.5, 29365.0, 54253.0, 80411.0, 98094.5, 124835.0, 246224.0, 837120.0)
    ),
    turns=Deciles((3.0, 5.5, 10.0, 16.5, 24.0, 32.5, 40.0, 51.5, 67.0, 89.0, 170.0)),
    new_tokens=Deciles((1.0, 9.0, 53.0, 131.0, 249.0, 383.0, 612.0, 974.7, 1664.0, 3301.8, 146409.0)),
    output=Deciles((0.0, 110.0, 136.0, 161.0, 196.0, 240.0, 300.0, 391.0, 538.0, 910.5, 18195.0)),
    think_tool=Deciles((0.0, 5.0, 6.0, 7.0, 8.0, 9.0, 12.0, 16.0, 23.0, 66.0, 3696.0)),
    think_user=Deciles((3.0, 22.0, 34.6, 49.0, 73.0, 114.0, 171.0, 264.0, 519.4, 1935.4, 36236.0)),
    user_turn_prob=0.259,
    rewrite_prob=0.071,
    rewrite_keep=Deciles((0.0, 0.104, 0.169, 0.991, 0.998, 0.999, 0.999, 0.999, 0.999, 1.0, 1.0)),
    rewrite_new=Deciles(
        (159.0, 328.7, 443.8, 679.2, 912.8, 1357.0, 2343.0, 8522.2, 49608.6, 89567.7, 697351.0)
    ),
    peak_context=Deciles(
        (
            14383.0,
            69563.5,
            101125.0,
            129530.5,
            139616.0,
            145603.0,
            150283.0,
            155538.0,
            221896.0,
            317181.5,
            881443.0,
        )
    ),
)
DEFAULT_SUB = AgentShape(
    prefix_tokens=8437,
    first_context=Deciles(
        (2475.0, 2483.4, 2783.4, 3233.2, 3269.6, 3287.0, 3296.8, 3306.6, 3318.8, 3452.3, 3747.0)
    ),
    turns=Deciles((4.0, 4.7, 5.8, 7.0, 7.0, 7.0, 7.8, 10.6, 11.6, 13.5, 17.0)),
    new_tokens=Deciles(
        (25.0, 267.6, 688.4, 1292.5, 2274.6, 3001.5, 3452.8, 4916.0, 7100.4, 16540.1, 58728.0)
    ),
    output=Deciles((80.0, 132.9, 145.6, 172.7, 187.6, 208.0, 240.4, 292.0, 336.6, 1836.3, 4797.0)),
    think_tool=Deciles((1.0, 2.0, 3.0, 3.0, 3.0, 4.0, 4.0, 5.0, 6.0, 23.6, 65.0)),
    think_user=Deciles((1.0, 2.0, 3.0, 3.0, 3.0, 4.0, 4.0, 5.0, 6.0, 23.6, 65.0)),  # (#) = think_tool
    user_turn_prob=0.0,
    rewrite_prob=0.032,
    rewrite_keep=Deciles((0.999,) * 11),  # (#) both observed rewrites kept 99.9 %
    rewrite_new=Deciles((6861.0,) * 5 + (13304.0,) * 6),  # (#) the two observed values
    peak_context=Deciles(
        (53136.0, 60465.7, 67103.4, 72429.6, 73000.8, 76750.0, 80788.0, 82370.0, 88377.6, 93665.4, 97010.0)
    ),
    start_delay=0.69,
)


@dataclass(frozen=True, slots=True)
class SyntheticConfig:
    main: AgentShape = DEFAULT_MAIN
    sub: AgentShape = DEFAULT_SUB
    subagent_prob: float = 0.000724  # a group of sub-agents after a parent turn
    subagents_per_group: Deciles = Deciles((1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.4, 1.8, 2.2, 2.6, 3.0))
    block_size: int = 64
    max_input_tokens: int = 1_000_000  # a session ends before a prompt this long


DEFAULT = SyntheticConfig()


# ---------------------------------------------------------------------------------------------------
# generation


@dataclass(slots=True)
class _Ids:
    next_id: int = 1 << 24  # fresh block ids; shared prefixes use small ids
    shared: dict[str, list[int]] = field(default_factory=dict)

    def fresh(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def prefix(self, kind: str, n_blocks: int) -> list[int]:
        base = {"main": 1, "sub": 1 << 20}[kind]
        return self.shared.setdefault(kind, list(range(base, base + n_blocks)))


def _agent(cfg: SyntheticConfig, kind: str, sid: str, rng: random.Random, ids: _Ids) -> Session:
    shape = cfg.main if kind == "main" else cfg.sub
    b = cfg.block_size
    prefix = ids.prefix(kind, shape.prefix_tokens // b)
    window = max(shape.peak_context.sample(rng), shape.prefix_tokens + 2 * b)
    first = shape.prefix_tokens + round(shape.first_context.sample(rng))
    in_len = min(first, round(window) - 1, cfg.max_input_tokens - 1)
    hashes = prefix + ids.fresh(in_len // b - len(prefix))
    n_turns = max(1, round(shape.turns.sample(rng)))
    requests: list[Request] = []
    think = shape.start_delay
    for k in range(n_turns):
        if in_len >= cfg.max_input_tokens:
            break
        out = max(1, round(shape.output.sample(rng)))
        user_next = rng.random() < shape.user_turn_prob
        subs: tuple[Session, ...] = ()
        if kind == "main" and k < n_turns - 1 and rng.random() < cfg.subagent_prob:
            g = max(1, round(cfg.subagents_per_group.sample(rng)))
            subs = tuple(_agent(cfg, "sub", f"{sid}/sub{k}.{j}", rng, ids) for j in range(g))
        requests.append(
            Request(in_len, out, tuple(hashes), think, subs, "end_turn" if user_next else "tool_use")
        )
        think = (shape.think_user if user_next else shape.think_tool).sample(rng)
        grown = in_len + out + round(shape.new_tokens.sample(rng))
        if grown + out > window:  # the context window is full: compact down to the shared prefix
            keep = len(prefix)
            in_len = keep * b + min(round(shape.rewrite_new.sample(rng)), round(window / 2))
        elif rng.random() < shape.rewrite_prob:
            keep = max(len(prefix), int(shape.rewrite_keep.sample(rng) * len(hashes)))
            keep = min(keep, max(len(hashes) - 1, len(prefix)))
            in_len = min(keep * b + round(shape.rewrite_new.sample(rng)), round(window) - 1)
        else:
            keep, in_len = len(hashes), grown
        del hashes[keep:]
        hashes.extend(ids.fresh(in_len // b - len(hashes)))
    return Session(sid, tuple(requests), b, "", (), {"synthetic": kind, "tool_tokens": shape.prefix_tokens})


def generate(config: SyntheticConfig = DEFAULT, n: int = 1, seed: int = 0) -> list[Session]:
    """`n` sessions; the same (config, n, seed) gives the same sessions."""
    stream = session_stream(config, seed)
    return [next(stream) for _ in range(n)]


def session_stream(config: SyntheticConfig = DEFAULT, seed: int = 0) -> Iterator[Session]:
    """An endless, deterministic stream of sessions (a closed loop draws from it)."""
    rng = random.Random(seed)
    ids = _Ids()
    k = 0
    while True:
        yield _agent(config, "main", f"syn{seed}-{k:05d}", rng, ids)
        k += 1


# ---------------------------------------------------------------------------------------------------
# fitting


def observe(sessions: list[Session], depth: int = 0) -> dict[str, list[float]]:
    """Per-turn samples of the sessions at `depth` (0: top-level agents, 1: their sub-agents)."""
    s: dict[str, list[float]] = {
        k: []
        for k in (
            "prefix_tokens",
            "first_context",
            "turns",
            "new_tokens",
            "output",
            "think_tool",
            "think_user",
            "user_turn",
            "rewrite",
            "rewrite_keep",
            "rewrite_new",
            "start_delay",
            "subagent_group",
            "group_size",
            "peak_context",
        )
    }
    for top in sessions:
        for d, sess in top.walk():
            if d != depth:
                continue
            reqs = sess.requests
            prefix = float(sess.meta.get("system_tokens", 0) + sess.meta.get("tool_tokens", 0))
            s["prefix_tokens"].append(prefix)
            s["first_context"].append(max(1.0, reqs[0].input_len - prefix))
            s["turns"].append(len(reqs))
            s["start_delay"].append(reqs[0].think_time)
            s["peak_context"].append(max(r.input_len + r.output_len for r in reqs))
            for r in reqs:
                s["output"].append(r.output_len)
                s["subagent_group"].append(1.0 if r.subagents else 0.0)
                if r.subagents:
                    s["group_size"].append(len(r.subagents))
            for a, b in zip(reqs, reqs[1:], strict=False):
                user = a.stop != "tool_use"
                s["user_turn"].append(1.0 if user else 0.0)
                if not a.subagents:
                    s["think_user" if user else "think_tool"].append(b.think_time)
                c = common_prefix(a.hash_ids, b.hash_ids)
                if c == len(a.hash_ids):
                    s["rewrite"].append(0.0)
                    s["new_tokens"].append(max(1, b.input_len - a.input_len - a.output_len))
                else:
                    s["rewrite"].append(1.0)
                    s["rewrite_keep"].append(c * sess.block_size / a.input_len)
                    s["rewrite_new"].append(max(1, b.input_len - c * sess.block_size))
    return s


def _shape_from(s: dict[str, list[float]], base: AgentShape) -> AgentShape:
    def dist(key: str) -> Deciles:
        return Deciles.fit(s[key]) if len(s[key]) >= 4 else getattr(base, key)

    def mean(key: str, old: float) -> float:
        return round(float(np.mean(s[key])), 3) if s[key] else old

    return replace(
        base,
        prefix_tokens=int(np.median(s["prefix_tokens"])) if s["prefix_tokens"] else base.prefix_tokens,
        **{
            k: dist(k)
            for k in (
                "first_context",
                "turns",
                "new_tokens",
                "output",
                "think_tool",
                "think_user",
                "rewrite_keep",
                "rewrite_new",
                "peak_context",
            )
        },
        user_turn_prob=mean("user_turn", base.user_turn_prob),
        rewrite_prob=mean("rewrite", base.rewrite_prob),
        start_delay=round(float(np.median(s["start_delay"])), 2) if s["start_delay"] else base.start_delay,
    )


def fit(sessions: list[Session]) -> SyntheticConfig:
    """A `SyntheticConfig` matching a trace set's statistics (falls back to `DEFAULT` where it has none)."""
    main, sub = observe(sessions, 0), observe(sessions, 1)
    return SyntheticConfig(
        main=replace(_shape_from(main, DEFAULT_MAIN), start_delay=0.0),
        sub=_shape_from(sub, DEFAULT_SUB) if sub["turns"] else DEFAULT_SUB,
        subagent_prob=(
            round(float(np.mean(main["subagent_group"])), 6) if main["output"] else DEFAULT.subagent_prob
        ),
        subagents_per_group=(
            Deciles.fit(main["group_size"]) if len(main["group_size"]) >= 4 else DEFAULT.subagents_per_group
        ),
        block_size=sessions[0].block_size if sessions else DEFAULT.block_size,
    )


def describe(sessions: list[Session], depth: int = 0) -> dict[str, dict[str, float]]:
    """Quantiles (p10/p25/p50/p75/p90/p99, mean, n) of each observed quantity."""
    out = {}
    for key, values in observe(sessions, depth).items():
        if values:
            q = np.percentile(values, [10, 25, 50, 75, 90, 99])
            out[key] = {f"p{p}": round(float(v), 3) for p, v in zip((10, 25, 50, 75, 90, 99), q, strict=True)}
            out[key] |= {"mean": round(float(np.mean(values)), 3), "n": len(values)}
    return out
