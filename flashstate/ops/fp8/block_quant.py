"""Block-wise FP8 weights, the layout of the published FP8 checkpoints (DeepSeek-V3, Qwen3-*-FP8): a
weight [..., N, K] is stored as float8_e4m3fn with one fp32 `weight_scale_inv` per 128×128 block,
[..., ceil(N/128), ceil(K/128)]; the real weight is `fp8.float() * scale_inv` over the block. Plain torch:
the quantizer used to write and to load-quantize checkpoints, and the dequantizer of the CPU path."""

from __future__ import annotations

import torch
from torch import Tensor

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def _expand(scale_inv: Tensor, n: int, k: int) -> Tensor:
    """scale_inv [..., ceil(n/128), ceil(k/128)] → [..., n, k], each block's scale over its elements."""
    return scale_inv.repeat_interleave(BLOCK, dim=-2)[..., :n, :].repeat_interleave(BLOCK, dim=-1)[..., :k]


def quantize_block(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [..., N, K] (any float dtype) → (fp8 [..., N, K], scale_inv fp32 [..., ceil(N/128), ceil(K/128)]).
    scale_inv = amax(|block|) / 448, 1.0 for an all-zero block; the quantized value is w / scale_inv,
    rounded to nearest by the cast (|w / scale_inv| ≤ 448 by construction, the clamp guards rounding)."""
    if w.dim() < 2:
        raise ValueError(f"quantize_block needs a [..., N, K] weight, got shape {tuple(w.shape)}")
    *lead, n, k = w.shape
    nb, kb = _blocks(n), _blocks(k)
    h = w.float()
    if n % BLOCK or k % BLOCK:
        # Zero padding never raises a block's amax; the pad is cut off below.
        h = torch.nn.functional.pad(h, (0, kb * BLOCK - k, 0, nb * BLOCK - n))
    tiles = h.reshape(*lead, nb, BLOCK, kb, BLOCK)
    amax = tiles.abs().amax(dim=(-3, -1))  # [..., nb, kb]
    scale_inv = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (tiles / scale_inv.unsqueeze(-1).unsqueeze(-3)).clamp_(-FP8_MAX, FP8_MAX)
    q = q.reshape(*lead, nb * BLOCK, kb * BLOCK)[..., :n, :k]
    return q.to(FP8_DTYPE).contiguous(), scale_inv.contiguous()


def dequantize_block(w_fp8: Tensor, scale_inv: Tensor, dtype: torch.dtype) -> Tensor:
    """fp8 [..., N, K] with scale_inv [..., ceil(N/128), ceil(K/128)] → the weight in `dtype` (the product
    is formed in fp32, then cast)."""
    *_, n, k = w_fp8.shape
    expect = (*w_fp8.shape[:-2], _blocks(n), _blocks(k))
    if tuple(scale_inv.shape) != expect:
        raise ValueError(
            f"weight_scale_inv has shape {tuple(scale_inv.shape)}, expected {expect} for a weight of shape "
            f"{tuple(w_fp8.shape)} with {BLOCK}x{BLOCK} blocks"
        )
    return (w_fp8.float() * _expand(scale_inv.float(), n, k)).to(dtype)
