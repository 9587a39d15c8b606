"""Synthetic coding agents whose statistics are fitted to real Claude-Code traces.

`observe(sessions)` measures a trace set (per-session and per-turn samples); `fit(sessions)` turns them
into a `SyntheticConfig` (empirical quantiles, a correlation); `generate(config, n, seed)` draws sessions
in the AgentX shape (`workloads.Session`). `DEFAULT` (synthetic_defaults.py) is `fit()` of the 166
sessions in `shared/traces/claude-code`, and the tests check it still is.

An agent: a prefix shared by every session (tool definitions + system prompt: the same hash ids in every
session), a first context, then turns. A turn re-sends the previous prompt and output plus new tokens
(tool results); with `rewrite_prob` it keeps only part of the context (edits, compaction) and adds new
tokens after it; past the session's context window (its peak, drawn per session) it compacts down to the
shared prefix. Think time follows a tool call (short) or a user turn (long). The number of turns and the
first context are drawn jointly (a Gaussian copula: long sessions start small, as in the traces). After
a turn, with `subagent_prob`, a group of sub-agents (their own shared prefix and shape) runs and joins.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from flashstate.bench.prompts import common_prefix
from flashstate.bench.synthetic_config import AgentShape, Quantiles, SyntheticConfig
from flashstate.bench.synthetic_defaults import DEFAULT
from flashstate.bench.workloads import Request, Session

_NORMAL = NormalDist()


@dataclass(slots=True)
class _Ids:
    next_id: int = 1 << 24  # fresh block ids; the shared prefixes use small ids
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
    z_turns, z = rng.gauss(0.0, 1.0), rng.gauss(0.0, 1.0)
    z_first = shape.turns_first_rho * z_turns + math.sqrt(1 - shape.turns_first_rho**2) * z
    n_turns = max(1, round(shape.turns.at(_NORMAL.cdf(z_turns))))
    first = shape.prefix_tokens + round(shape.first_context.at(_NORMAL.cdf(z_first)))
    u_min = shape.peak_context.cdf(first)  # the window holds the first context: draw it above
    window = max(shape.peak_context.at(u_min + (1 - u_min) * rng.random()), first + 2 * b)
    in_len = min(first, cfg.max_input_tokens - 1)
    hashes = prefix + ids.fresh(in_len // b - len(prefix))
    requests: list[Request] = []
    think = shape.start_delay
    for k in range(n_turns):
        out = max(1, round(shape.output.sample(rng)))
        user_next = rng.random() < shape.user_turn_prob
        subs: tuple[Session, ...] = ()
        if kind == "main" and k < n_turns - 1 and rng.random() < cfg.subagent_prob:
            g = max(1, round(cfg.subagents_per_group.sample(rng)))
            subs = tuple(_agent(cfg, "sub", f"{sid}/sub{k}.{j}", rng, ids) for j in range(g))
        stop = "end_turn" if user_next else "tool_use"
        requests.append(Request(in_len, out, tuple(hashes), think, subs, stop))
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
        if in_len >= cfg.max_input_tokens:
            break
        del hashes[keep:]
        hashes.extend(ids.fresh(in_len // b - len(hashes)))
    meta = {"synthetic": kind, "tool_tokens": shape.prefix_tokens}
    return Session(sid, tuple(requests), b, "", (), meta)


def session_stream(config: SyntheticConfig | None = None, seed: int = 0) -> Iterator[Session]:
    """An endless, deterministic stream of sessions (a closed loop draws from it); None: DEFAULT."""
    config = config or DEFAULT
    rng = random.Random(seed)
    ids = _Ids()
    k = 0
    while True:
        yield _agent(config, "main", f"syn{seed}-{k:05d}", rng, ids)
        k += 1


def generate(config: SyntheticConfig | None = None, n: int = 1, seed: int = 0) -> list[Session]:
    """The first `n` sessions of `session_stream(config, seed)`."""
    stream = session_stream(config, seed)
    return [next(stream) for _ in range(n)]


# ---------------------------------------------------------------------------------------------------
# fitting

_KEYS = ("prefix_tokens", "first_context", "turns", "new_tokens", "output", "think_tool", "think_user",
         "user_turn", "rewrite", "rewrite_keep", "rewrite_new", "start_delay", "subagent_group", "group_size",
         "peak_context")  # fmt: skip


def observe(sessions: list[Session], depth: int = 0) -> dict[str, list[float]]:
    """Samples of the sessions at `depth` (0: top-level agents, 1: their sub-agents): per session
    (prefix, first context, turns, peak, start delay) and per turn (the rest)."""
    s: dict[str, list[float]] = {k: [] for k in _KEYS}
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
                if not a.subagents:  # after sub-agents the recorded wait is the post-join gap
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


def _normal_scores(x: list[float]) -> np.ndarray:
    ranks = np.argsort(np.argsort(x, kind="stable"), kind="stable")
    return np.array([_NORMAL.inv_cdf((r + 0.5) / len(x)) for r in ranks])


def _shape_from(s: dict[str, list[float]], base: AgentShape) -> AgentShape:
    """Fit what the samples support (at least 4 values); keep `base`'s value elsewhere."""

    def dist(key: str) -> Quantiles:
        return Quantiles.fit(s[key]) if len(s[key]) >= 4 else getattr(base, key)

    def mean(key: str, old: float) -> float:
        return round(float(np.mean(s[key])), 3) if s[key] else old

    rho = base.turns_first_rho
    if len(s["turns"]) >= 4:
        scores = np.corrcoef(_normal_scores(s["turns"]), _normal_scores(s["first_context"]))[0, 1]
        rho = round(float(np.nan_to_num(scores)), 3)
    dists = ("first_context", "turns", "new_tokens", "output", "think_tool", "think_user", "rewrite_keep",
             "rewrite_new", "peak_context")  # fmt: skip
    return AgentShape(
        prefix_tokens=int(np.median(s["prefix_tokens"])) if s["prefix_tokens"] else base.prefix_tokens,
        **{k: dist(k) for k in dists},
        turns_first_rho=rho,
        user_turn_prob=mean("user_turn", base.user_turn_prob),
        rewrite_prob=mean("rewrite", base.rewrite_prob),
        start_delay=round(float(np.median(s["start_delay"])), 2) if s["start_delay"] else base.start_delay,
    )


def fit(sessions: list[Session], base: SyntheticConfig | None = None) -> SyntheticConfig:
    """A `SyntheticConfig` matching a trace set's statistics (`base`'s values where it has too few
    samples; default base: DEFAULT)."""
    base = base or DEFAULT
    main, sub = observe(sessions, 0), observe(sessions, 1)
    main_shape = _shape_from(main, base.main)
    return SyntheticConfig(
        main=AgentShape(**{**{k: getattr(main_shape, k) for k in main_shape.__slots__}, "start_delay": 0.0}),
        sub=_shape_from(sub, base.sub),
        subagent_prob=round(float(np.mean(main["subagent_group"])), 6)
        if main["output"]
        else base.subagent_prob,
        subagents_per_group=(
            Quantiles.fit(main["group_size"]) if len(main["group_size"]) >= 4 else base.subagents_per_group
        ),
        block_size=sessions[0].block_size if sessions else base.block_size,
        max_input_tokens=base.max_input_tokens,
    )


def describe(sessions: list[Session], depth: int = 0) -> dict[str, dict[str, float]]:
    """Quantiles (p10/p25/p50/p75/p90/p99, mean, n) of each observed quantity."""
    out = {}
    ps = (10, 25, 50, 75, 90, 99)
    for key, values in observe(sessions, depth).items():
        if values:
            q = np.percentile(values, ps)
            out[key] = {f"p{p}": round(float(v), 3) for p, v in zip(ps, q, strict=True)}
            out[key] |= {"mean": round(float(np.mean(values)), 3), "n": len(values)}
    return out
