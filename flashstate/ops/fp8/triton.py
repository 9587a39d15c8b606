"""The block-FP8 linear layer on the GPU: y = x · Wᵀ with W [N, K] float8_e4m3fn and one fp32 scale per
128×128 block of W (block_quant.py), fp32 accumulation, the output in x's dtype. No device wait anywhere
and tile sizes from the shape alone (no autotuning), so a CUDA graph captures it.

`fp8_linear` hands large bf16 GEMMs (`cublas.CUBLAS_MIN_MNK`) with whole 128-blocks to cuBLAS's
block-FP8 GEMM on SM90 (cublas.py; this file quantizes their activations). The Triton GEMM here has two
modes, chosen by the row count M (every row of x[..., K]):
    w8a8   (M > W8A16_MAX_ROWS, prefill)  x is quantized per token per 128-column group to e4m3 with an
           fp32 scale [M, ceil(K/128)] (`quantize_activation`, one kernel), then FP8 tensor-core dots:
           per K block kb, acc += (x_q · W_qᵀ)[kb] · x_scale[:, kb] · w_scale[n // 128, kb]
    w8a16  (M ≤ W8A16_MAX_ROWS, decode)   x stays in its dtype, each W tile is widened to it and
           acc += (x · W_qᵀ)[kb] · w_scale[n // 128, kb]: one kernel, no activation rounding. Decode reads
           the weights once whatever the dot's type, so FP8 dots would gain nothing there and the
           quantization would cost a launch per layer.
BLOCK_K is the 128 of the scale blocks: each K step of a tile sees one scale per row and per column."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashstate.ops.fp8 import cublas
from flashstate.ops.fp8.block_quant import BLOCK, FP8_DTYPE, FP8_MAX

W8A16_MAX_ROWS = 16  # up to here widening the weight tiles costs no more than quantizing the activations
SCALE_FLOOR = 1e-10  # an all-zero group's scale (its values quantize to 0 whatever the scale)


class Tiles(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@triton.jit
def _act_quant_kernel(
    x, q, s, M, M_PAD, K, stride_x, stride_q, stride_sm, stride_sg,
    FP8_MAX: tl.constexpr, FLOOR: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    """Rows [pid_m·BLOCK_M, +BLOCK_M) of group g (columns [g·GROUP, +GROUP)): scale = amax / FP8_MAX per
    row, q = x / scale (|q| ≤ FP8_MAX, the clamp guards rounding). Rows [M, M_PAD) are padding: zeros with
    the floor's scale."""
    pid_m, g = tl.program_id(0), tl.program_id(1)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = g * GROUP + tl.arange(0, GROUP)
    col_ok = (cols < K)[None, :]
    v = tl.load(x + rows[:, None] * stride_x + cols[None, :], mask=(rows < M)[:, None] & col_ok, other=0.0)
    v = v.to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(v), axis=1), FLOOR) / FP8_MAX
    v = tl.clamp(v / scale[:, None], -FP8_MAX, FP8_MAX)
    out_ok = rows < M_PAD
    q_ptrs = q + rows[:, None] * stride_q + cols[None, :]
    tl.store(q_ptrs, v.to(q.dtype.element_ty), mask=out_ok[:, None] & col_ok)
    tl.store(s + rows * stride_sm + g * stride_sg, scale, mask=out_ok)


def quantize_activation(x: Tensor, cublas_layout: bool = False) -> tuple[Tensor, Tensor]:
    """x [M, K] (last dim contiguous) → (e4m3 [M, K], fp32 scales [M, ceil(K/128)]) with x ≈ q · scale
    over each row's 128-column group; an all-zero group gets a tiny scale and zeros. `cublas_layout`: the
    layout `cublas.block_fp8_mm` takes instead: M padded to a multiple of 4 (zero rows) and the scales
    outer-dim-major (strides (1, M_pad))."""
    m, k = x.shape
    groups = triton.cdiv(k, BLOCK)
    m_pad = -(-m // 4) * 4 if cublas_layout else m
    q = torch.empty(m_pad, k, dtype=FP8_DTYPE, device=x.device)
    if cublas_layout:
        s = torch.empty_strided((m_pad, groups), (1, m_pad), dtype=torch.float32, device=x.device)
    else:
        s = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    if m_pad and k:
        block_m = 16 if m >= 4096 else 4
        _act_quant_kernel[(triton.cdiv(m_pad, block_m), groups)](
            x, q, s, m, m_pad, k, x.stride(0), q.stride(0), s.stride(0), s.stride(1),
            FP8_MAX=FP8_MAX, FLOOR=SCALE_FLOOR, BLOCK_M=block_m, GROUP=BLOCK, num_warps=4,
        )  # fmt: skip
    return q, s


@triton.jit
def _block_fp8_gemm_kernel(
    a, a_scale, w, w_scale, bias, c,
    M, N, K,
    stride_a, stride_as, stride_w, stride_ws, stride_c,
    A_FP8: tl.constexpr, PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """c [M, N] = a [M, K] · (w [N, K] ⊙ block scales)ᵀ (+ bias); a is e4m3 with per-row-group scales
    `a_scale` [M, K/BLOCK_K] (A_FP8) or in c's dtype. Programs walk GROUP_M row tiles per column tile so
    that neighbours share W tiles in L2."""
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = pid // per_group * GROUP_M
    group_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a + rows64[:, None] * stride_a + ks[None, :]
    w_ptrs = w + cols64[None, :] * stride_w + ks[:, None]
    ws_ptrs = w_scale + (cols // BLOCK_K).to(tl.int64) * stride_ws  # scale row n // 128, column kb
    as_ptrs = a_scale + rows64 * stride_as
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            at = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            wt = tl.load(w_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = ks < K - kb * BLOCK_K
            at = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wt = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        ws = tl.load(ws_ptrs + kb, mask=col_ok, other=0.0)
        if A_FP8:
            sa = tl.load(as_ptrs + kb, mask=row_ok, other=0.0)
            acc += tl.dot(at, wt) * sa[:, None] * ws[None, :]
        else:
            acc += tl.dot(at, wt.to(at.dtype), input_precision=PRECISION) * ws[None, :]
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c + rows64[:, None] * stride_c + cols[None, :]
    tl.store(c_ptrs, acc.to(c.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def choose_tiles(m: int, n: int, a_fp8: bool) -> Tiles:
    """Tiles for an [m, n] output: small row tiles and enough column tiles to keep ~2 CTAs per SM
    streaming weights when m is small (bandwidth-bound); 128-wide tiles on the FP8 tensor cores beyond."""
    if not a_fp8:
        bm = 16 if m <= 16 else 32 if m <= 32 else 64
        bn = next((b for b in (128, 64, 32) if triton.cdiv(m, bm) * triton.cdiv(n, b) >= 2 * 132), 16)
        return Tiles(bm, bn, 4, 4)
    if m <= 128:
        return Tiles(64, 64 if n <= 4096 else 128, 4, 4)
    if m * n <= 512 * 4096:  # too few 128×128 tiles to fill the card
        return Tiles(64, 128, 4, 4)
    return Tiles(128, 128, 8, 3)


def block_fp8_gemm(
    x: Tensor, weight: Tensor, weight_scale_inv: Tensor, bias: Tensor | None = None,
    a_fp8: bool | None = None, tiles: Tiles | None = None,
) -> Tensor:  # fmt: skip
    """x [M, K] (last dim contiguous, any float dtype) → [M, N] in x's dtype. `a_fp8` forces the mode (None:
    w8a8 above W8A16_MAX_ROWS rows); `tiles` overrides the chosen tiles."""
    m, k = x.shape
    n = weight.shape[0]
    if a_fp8 is None:
        a_fp8 = m > W8A16_MAX_ROWS
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand(m, n))
    tiles = tiles or choose_tiles(m, n, a_fp8)
    if a_fp8:
        a, a_scale = quantize_activation(x)
    else:
        a, a_scale = x, weight_scale_inv  # a_scale unread
    grid = (triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n),)
    _block_fp8_gemm_kernel[grid](
        a, a_scale, weight, weight_scale_inv, bias if bias is not None else weight_scale_inv, out,
        m, n, k,
        a.stride(0), a_scale.stride(0), weight.stride(0), weight_scale_inv.stride(0), out.stride(0),
        A_FP8=a_fp8, PRECISION="ieee" if x.dtype == torch.float32 else "tf32", HAS_BIAS=bias is not None,
        EVEN_K=k % BLOCK == 0, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=BLOCK, GROUP_M=8,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out


def check_weight(weight: Tensor, weight_scale_inv: Tensor, k: int) -> None:
    """Refuses a weight that is not e4m3 [N, k] with fp32 scales [ceil(N/128), ceil(k/128)]."""
    n = weight.shape[0]
    want = (triton.cdiv(n, BLOCK), triton.cdiv(k, BLOCK))
    if weight.dtype != FP8_DTYPE or weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"fp8_linear needs a {FP8_DTYPE} weight [N, {k}], got {weight.dtype} "
                         f"{tuple(weight.shape)}")  # fmt: skip
    if weight_scale_inv.dtype != torch.float32 or tuple(weight_scale_inv.shape) != want:
        raise ValueError(f"weight_scale_inv must be fp32 {want} for a weight {tuple(weight.shape)}, got "
                         f"{weight_scale_inv.dtype} {tuple(weight_scale_inv.shape)}")  # fmt: skip


def fp8_linear(x: Tensor, weight: Tensor, weight_scale_inv: Tensor, bias: Tensor | None = None) -> Tensor:
    """Same contract as `naive.fp8_linear`: x [..., K] → [..., N] in x's dtype, fp32 accumulation."""
    k = x.shape[-1]
    check_weight(weight, weight_scale_inv, k)
    flat = x.reshape(-1, k)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    m, n, ws = flat.shape[0], weight.shape[0], weight_scale_inv.contiguous()
    gemm = cublas_gemm if cublas.usable(m, n, k, flat.dtype, flat.device) else block_fp8_gemm
    out = gemm(flat, w, ws, bias)
    return out.view(*x.shape[:-1], n)


def cublas_gemm(x: Tensor, weight: Tensor, weight_scale_inv: Tensor, bias: Tensor | None = None) -> Tensor:
    """block_fp8_gemm's contract through cuBLAS (cublas.py): x [M, K] bf16, K and N multiples of 128."""
    q, q_scale = quantize_activation(x, cublas_layout=True)
    out = cublas.block_fp8_mm(q, q_scale, weight, weight_scale_inv, x.dtype)[: x.shape[0]]
    return out if bias is None else out.add_(bias)
