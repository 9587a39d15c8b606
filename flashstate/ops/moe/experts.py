"""`Experts`: one MoE layer's routed experts as the fused kernels read them, and as the oracle runs them.

Layout (every expert the same shape):
    w_in  [E, N_in, D]  gated: rows [gate (I) ; up (I)], N_in = 2I;  ungated: the up rows, N_in = I
    w_out [E, D, I]     the down projection
An expert computes  w_out[e] · act(w_in[e] · x)  with act = silu(gate) · up (gated) or, ungated,
relu(u)² ("relu2") or silu(u) ("silu")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

ACTIVATIONS = ("silu", "relu2")


@dataclass(frozen=True, eq=False)
class Experts:
    w_in: Tensor
    w_out: Tensor
    act: str
    gated: bool
    # Per-expert forwards the oracle calls (the model's own modules, so the CPU path keeps their exact
    # arithmetic); None: the oracle computes each expert from the stacks.
    modules: Sequence[Callable[[Tensor], Tensor]] | None = None
    # Dtype the oracle sums the weighted expert outputs in (None: x's dtype); the fused kernels
    # accumulate in fp32 whatever this says.
    accumulate: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.act not in ACTIVATIONS:
            raise ValueError(f"unsupported expert activation {self.act!r} (one of {ACTIVATIONS})")
        e, n_in, d = self.w_in.shape
        i = n_in // 2 if self.gated else n_in
        if self.w_out.shape != (e, d, i) or (self.gated and n_in % 2):
            raise ValueError(f"expert stacks disagree: w_in {tuple(self.w_in.shape)}, w_out "
                             f"{tuple(self.w_out.shape)}, gated={self.gated}")  # fmt: skip

    @property
    def num_experts(self) -> int:
        return self.w_in.shape[0]

    @property
    def intermediate_size(self) -> int:
        return self.w_out.shape[2]
