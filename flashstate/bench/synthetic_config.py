"""The shape of a synthetic coding agent (`SyntheticConfig`: per-quantity empirical quantiles, for the
main agent and its sub-agents), fitted and drawn by synthetic.py; synthetic_defaults.py holds the fit."""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

PROBS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)  # quantiles kept per quantity
_NORMAL = NormalDist()


@dataclass(frozen=True, slots=True)
class Quantiles:
    """An empirical distribution: its values at `PROBS`. Between two points the inverse CDF interpolates
    geometrically where both are positive (the traces' quantities are heavy-tailed), else linearly."""

    points: tuple[float, ...]

    def at(self, u: float) -> float:
        i = min(max(bisect.bisect_right(PROBS, u) - 1, 0), len(PROBS) - 2)
        lo, hi = self.points[i], self.points[i + 1]
        f = (u - PROBS[i]) / (PROBS[i + 1] - PROBS[i])
        return lo * (hi / lo) ** f if lo > 0 and hi > 0 else lo + (hi - lo) * f

    def sample(self, rng: random.Random) -> float:
        return self.at(rng.random())

    def cdf(self, x: float) -> float:
        """The inverse of `at` (0 below the minimum, 1 above the maximum)."""
        pts = self.points
        if x <= pts[0]:
            return 0.0
        if x >= pts[-1]:
            return 1.0
        i = bisect.bisect_right(pts, x) - 1
        lo, hi = pts[i], pts[i + 1]
        f = math.log(x / lo) / math.log(hi / lo) if lo > 0 and hi > lo else (x - lo) / (hi - lo)
        return PROBS[i] + f * (PROBS[i + 1] - PROBS[i])

    def mean(self) -> float:
        total = 0.0
        for k in range(len(PROBS) - 1):
            lo, hi, w = self.points[k], self.points[k + 1], PROBS[k + 1] - PROBS[k]
            geometric = lo > 0 and hi > 0 and lo != hi
            total += w * ((hi - lo) / math.log(hi / lo) if geometric else (lo + hi) / 2)
        return total

    @classmethod
    def fit(cls, values: list[float]) -> Quantiles:
        q = np.percentile(np.asarray(values, dtype=float), [100 * p for p in PROBS])
        return cls(tuple(round(float(x), 3) for x in q))


@dataclass(frozen=True, slots=True)
class AgentShape:
    prefix_tokens: int  # shared by all sessions of this kind
    first_context: Quantiles  # first prompt minus the shared prefix
    turns: Quantiles
    turns_first_rho: float  # correlation of turns and first context (normal scores)
    new_tokens: Quantiles  # tokens a turn adds after the previous prompt + output
    output: Quantiles
    think_tool: Quantiles  # seconds after a tool call
    think_user: Quantiles  # seconds after a user turn (end_turn, interrupted)
    user_turn_prob: float
    rewrite_prob: float  # a turn keeps only part of the previous prompt
    rewrite_keep: Quantiles  # fraction of the previous prompt kept
    rewrite_new: Quantiles  # tokens after the kept part of a rewrite
    peak_context: Quantiles  # a session's largest prompt + output: its context window
    start_delay: float = 0.0  # seconds from launch to the first request (sub-agents)


@dataclass(frozen=True, slots=True)
class SyntheticConfig:
    main: AgentShape
    sub: AgentShape
    subagent_prob: float  # a group of sub-agents after a parent turn
    subagents_per_group: Quantiles
    block_size: int = 64
    max_input_tokens: int = 1_000_000  # a session ends before a prompt this long


# ---------------------------------------------------------------------------------------------------
# generation
