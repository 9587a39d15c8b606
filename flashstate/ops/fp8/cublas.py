"""cuBLAS's block-FP8 GEMM on Hopper, through `torch.nn.functional.scaled_mm` (torch ≥ 2.10 built with
CUDA ≥ 12.9): activations e4m3 with one fp32 scale per row per 128 columns (`BlockWise1x128`), weights
e4m3 with one fp32 scale per 128×128 block (`BlockWise128x128`), the published checkpoints' scaling, so
the weight and its `weight_scale_inv` go in as loaded. Scales are decode multipliers (x ≈ q · scale).

Layouts cuBLAS requires (read from the torch build on the card, benchmarks/gpu/fp8_scaled_mm.py):
    activations  q [M, K] row-major with M a multiple of 4; scales [M, K/128] outer-dim-major (strides
                 (1, M)) — `triton.quantize_activation(x, cublas_layout=True)` writes both;
    weights      W [N, K] row-major passed as Wᵀ (column-major [K, N]); scales [L4, N/128], L4 = K/128
                 rounded up to 4, K-block-major: `weight_scale_inv` [N/128, K/128] padded on its last dim
                 and transposed (a free view when K/128 is a multiple of 4).
M = 1 fails the scale-stride check and M = 5 is refused by cuBLAS's heuristic, hence the padding; K and N
multiples of 128 are the only shapes used here (the Triton GEMM keeps the rest).

cuBLAS is the faster GEMM on large shapes and the Triton kernels on small ones, where cuBLAS's per-call
floor dominates (fp8_linear's dispatch, `CUBLAS_MIN_MNK`; the timings are in benchmarks/RESULTS.md)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from flashstate.ops.fp8.block_quant import BLOCK

# the crossover: on the H200 every GEMM of Qwen3-Next-80B's projections (M = 16…8192) that cuBLAS ran
# faster is above, every one it ran slower or tied below (benchmarks/gpu/fp8_scaled_mm.py)
CUBLAS_MIN_MNK = 1 << 31


@functools.cache
def available(device_index: int) -> bool:
    """Whether this torch has block-scaled `scaled_mm` and the GPU is SM90 (the only arch cuBLAS runs
    DeepSeek-style block scaling on)."""
    scaling = getattr(F, "ScalingType", None)
    if not hasattr(F, "scaled_mm") or scaling is None or not hasattr(scaling, "BlockWise128x128"):
        return False
    return torch.cuda.get_device_capability(device_index) == (9, 0)


def usable(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `fp8_linear` on these shapes goes to cuBLAS: bf16 activations, a GEMM of at least
    CUBLAS_MIN_MNK, K and N whole scale blocks, on an SM90 GPU with block-scaled `scaled_mm`."""
    if m * n * k < CUBLAS_MIN_MNK or n % BLOCK or k % BLOCK:
        return False
    if dtype != torch.bfloat16 or device.type != "cuda":
        return False
    return available(device.index if device.index is not None else torch.cuda.current_device())


def weight_scales(weight_scale_inv: Tensor) -> Tensor:
    """`weight_scale_inv` [N/128, K/128] → cuBLAS's [L4, N/128] K-block-major layout (see the module
    docstring); zero padding for the K-blocks beyond K/128, which no activation column reaches."""
    pad = -weight_scale_inv.shape[1] % 4
    return (F.pad(weight_scale_inv, (0, pad)) if pad else weight_scale_inv).t()


def block_fp8_mm(
    q: Tensor, q_scale: Tensor, weight: Tensor, weight_scale_inv: Tensor, out_dtype: torch.dtype
) -> Tensor:
    """q [M_pad, K] e4m3 with scales [M_pad, K/128] (outer-dim-major) times (weight [N, K] e4m3 ⊙ its 128×128
    block scales)ᵀ → [M_pad, N] in `out_dtype`, fp32 accumulation in cuBLAS."""
    return F.scaled_mm(
        q, weight.t(), q_scale, F.ScalingType.BlockWise1x128,
        weight_scales(weight_scale_inv), F.ScalingType.BlockWise128x128, output_dtype=out_dtype,
    )  # fmt: skip
