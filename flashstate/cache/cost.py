"""Prefill cost model: C(n) = a·n + b·n² seconds to prefill n tokens from scratch.

The linear term covers MLPs, projections and the linear-attention layers; the quadratic term the
attention layers. Recomputing from a retained checkpoint at depth p up to depth n costs C(n) − C(p).
"""

from __future__ import annotations

from dataclasses import dataclass

# Where coefficients come from: the flag, a fit cached on disk, a fit measured now, the built-in default.
SOURCE_KINDS = ("given", "cached", "measured", "default")


@dataclass(frozen=True, slots=True)
class PrefillCost:
    a: float  # seconds per token
    b: float  # seconds per token²
    source: str = "given"  # one of SOURCE_KINDS, or "<kind>:<detail>" (e.g. a simulator profile)

    @property
    def kind(self) -> str:
        """The source as one of SOURCE_KINDS (a label for metrics: never a path); anything else, such as
        a simulator's hardware profile, counts as given."""
        head = self.source.partition(":")[0]
        return head if head in SOURCE_KINDS else "given"

    def __call__(self, n: int) -> float:
        return self.a * n + self.b * n * n

    def saved(self, depth: int, base: int) -> float:
        """Prefill seconds a checkpoint at `depth` saves over resuming from `base`."""
        return self(depth) - self(base)

    @classmethod
    def fit(cls, lengths: list[int], seconds: list[float], source: str = "measured") -> PrefillCost:
        """Least squares of seconds ≈ a·n + b·n² with a, b ≥ 0 (no intercept: C(0) = 0)."""
        if len(lengths) < 2 or len(lengths) != len(seconds):
            raise ValueError("need at least two (length, seconds) points")
        s11 = sum(n * n for n in lengths)
        s12 = sum(n**3 for n in lengths)
        s22 = sum(n**4 for n in lengths)
        t1 = sum(n * t for n, t in zip(lengths, seconds, strict=True))
        t2 = sum(n * n * t for n, t in zip(lengths, seconds, strict=True))
        det = s11 * s22 - s12 * s12
        a = (t1 * s22 - t2 * s12) / det if det else t1 / s11
        b = (s11 * t2 - s12 * t1) / det if det else 0.0
        if b < 0:  # attention too cheap to see at these lengths: a purely linear fit
            a, b = t1 / s11, 0.0
        if a < 0:
            a, b = 0.0, t2 / s22
        return cls(a, b, source)


# Used only when neither coefficients nor a calibration are available (tests, the simulator's defaults):
# roughly a 2B hybrid on one H200 (see docs/history/benchmarks-2026-11.md).
DEFAULT_COST = PrefillCost(8e-6, 1e-11, "default")
