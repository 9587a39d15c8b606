"""`Experts`: one MoE layer's routed experts as the fused kernels read them, and as the oracle runs them.

Layout (every expert the same shape):
    w_in  [E, N_in, D]  gated: rows [gate (I) ; up (I)], N_in = 2I;  ungated: the up rows, N_in = I
    w_out [E, D, I]     the down projection
An expert computes  w_out[e] · act(w_in[e] · x)  with act = silu(gate) · up (gated) or, ungated,
relu(u)² ("relu2") or silu(u) ("silu").

FP8 (block-quantized checkpoints): w_in / w_out are float8_e4m3fn and `w_in_scale` / `w_out_scale` hold
one fp32 factor per 128×128 block of each expert's matrix (block_quant.py's layout):
    w_in_scale  [E, ceil(N_in/128), ceil(D/128)]    row block n // 128 of the stacked gate|up rows
    w_out_scale [E, ceil(D/128), ceil(I/128)]"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

ACTIVATIONS = ("silu", "relu2")
SCALE_BLOCK = 128  # rows and columns of an FP8 scale block


def _blocks(n: int) -> int:
    return -(-n // SCALE_BLOCK)


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
    # FP8 block scales (fp32, layout above); set together, and then w_in / w_out are float8_e4m3fn.
    w_in_scale: Tensor | None = None
    w_out_scale: Tensor | None = None

    def __post_init__(self) -> None:
        if self.act not in ACTIVATIONS:
            raise ValueError(f"unsupported expert activation {self.act!r} (one of {ACTIVATIONS})")
        e, n_in, d = self.w_in.shape
        i = n_in // 2 if self.gated else n_in
        if self.w_out.shape != (e, d, i) or (self.gated and n_in % 2):
            raise ValueError(f"expert stacks disagree: w_in {tuple(self.w_in.shape)}, w_out "
                             f"{tuple(self.w_out.shape)}, gated={self.gated}")  # fmt: skip
        if self.w_in_scale is None and self.w_out_scale is None:
            return
        if self.w_in_scale is None or self.w_out_scale is None:
            raise ValueError("FP8 experts need both w_in_scale and w_out_scale")
        for name, w, scale in (("w_in", self.w_in, self.w_in_scale), ("w_out", self.w_out, self.w_out_scale)):
            want = (e, _blocks(w.shape[1]), _blocks(w.shape[2]))
            if w.dtype != torch.float8_e4m3fn:
                raise ValueError(f"{name} must be float8_e4m3fn when its scale is given, got {w.dtype}")
            if tuple(scale.shape) != want or scale.dtype != torch.float32:
                raise ValueError(f"{name}_scale must be float32 {want} (128x128 blocks of {name} "
                                 f"{tuple(w.shape)}), got {scale.dtype} {tuple(scale.shape)}")  # fmt: skip

    @property
    def fp8(self) -> bool:
        """Whether the stacks are block-quantized FP8 (the scales set)."""
        return self.w_in_scale is not None

    @property
    def num_experts(self) -> int:
        return self.w_in.shape[0]

    @property
    def intermediate_size(self) -> int:
        return self.w_out.shape[2]
