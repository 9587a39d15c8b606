"""The MoE experts on the GPU for block-FP8 stacks (Experts with w_in_scale / w_out_scale): the grouped
GEMMs of triton.py over the same expert-sorted assignments, with the 128×128 block scales applied per K
step (BLOCK_K = 128, so each step of a tile sees one scale per weight column and per activation row).

    w8a8   (row block ≥ 64: prefill)  x is quantized per token per 128-column group (fp8/triton.py) and
           the dots run on the FP8 tensor cores:
               acc += (x_q · W_qᵀ)[kb] · x_scale[a, kb] · w_scale[e, n // 128, kb]
           The up GEMM's 128-wide column tiles are whole groups of h, so its epilogue quantizes h per row
           (e4m3 + fp32 scale [T·k, ceil(I/128)]) for the down GEMM's FP8 dots.
    w8a16  (row block ≤ 32: decode)   x and h stay in x's dtype; each weight tile is widened to it and the
           partial product scaled per column: the weights are read once whatever the dot's type, so the
           bandwidth-bound steps keep triton.py's narrow tiles (enough CTAs to stream the touched
           experts) and skip quantizing the activations.

The rest is triton.py's contract: fp32 accumulation, y[a] = weights[a] · (w_out[e] · h[a]) per assignment,
out[t] = Σ_j y[t·k + j] in fp32, no device wait, tiles from the shape alone."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashstate.ops.fp8.block_quant import BLOCK, FP8_DTYPE, FP8_MAX
from flashstate.ops.fp8.triton import SCALE_FLOOR, quantize_activation
from flashstate.ops.moe.experts import Experts
from flashstate.ops.moe.triton import Tiles, _act, _precision, _row_block, align
from flashstate.ops.moe.triton import choose_tiles as bf16_tiles


@triton.jit
def _expert_up_fp8_kernel(
    x, x_scale, w, w_scale, h, h_scale, sorted_ids, block_expert,
    n_assign, top_k, num_experts, N, K,
    stride_x, stride_xs, stride_we, stride_wn, stride_se, stride_sn, stride_h, stride_hs,
    GATED: tl.constexpr, ACT: tl.constexpr, A_FP8: tl.constexpr, QUANT_OUT: tl.constexpr,
    PRECISION: tl.constexpr, EVEN_K: tl.constexpr, FP8_MAX: tl.constexpr, FLOOR: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """h[a, cols] = act(w_in[e] · x[a // k]) for a block of one expert's assignments; with QUANT_OUT
    (BLOCK_N = 128, the tile one scale group of h) h is stored as e4m3 with h_scale[a, pid_n]."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // num_n, pid % num_n
    e = tl.load(block_expert + pid_m).to(tl.int64)
    if e >= num_experts:
        return
    a = tl.load(sorted_ids + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = a < n_assign
    tok = (a // top_k).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x + tok[:, None] * stride_x + ks[None, :]
    g_ptrs = w + e * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]
    u_ptrs = g_ptrs + N * stride_wn
    # scale rows n // 128 of the gate rows n and of the up rows N + n
    gs_ptrs = w_scale + e * stride_se + (cols // BLOCK_K) * stride_sn
    us_ptrs = w_scale + e * stride_se + ((cols + N) // BLOCK_K) * stride_sn
    xs_ptrs = x_scale + tok * stride_xs
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            xa = tl.load(x_ptrs, mask=row_ok[:, None], other=0.0)
            wg = tl.load(g_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = ks < K - kb * BLOCK_K
            xa = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(g_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        sg = tl.load(gs_ptrs + kb, mask=col_ok, other=0.0)
        if A_FP8:
            sx = tl.load(xs_ptrs + kb, mask=row_ok, other=0.0)
            acc_g += tl.dot(xa, wg) * sx[:, None] * sg[None, :]
        else:
            acc_g += tl.dot(xa, wg.to(xa.dtype), input_precision=PRECISION) * sg[None, :]
        if GATED:
            if EVEN_K:
                wu = tl.load(u_ptrs, mask=col_ok[None, :], other=0.0)
            else:
                wu = tl.load(u_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            su = tl.load(us_ptrs + kb, mask=col_ok, other=0.0)
            if A_FP8:
                acc_u += tl.dot(xa, wu) * sx[:, None] * su[None, :]
            else:
                acc_u += tl.dot(xa, wu.to(xa.dtype), input_precision=PRECISION) * su[None, :]
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    y = _act(acc_g, ACT)
    if GATED:
        y = y * acc_u
    rows = a.to(tl.int64)
    out_mask = row_ok[:, None] & col_ok[None, :]
    if QUANT_OUT:  # columns past N hold act(0)·0 = 0: they never raise a row's amax
        scale = tl.maximum(tl.max(tl.abs(y), axis=1), FLOOR) / FP8_MAX
        y = tl.clamp(y / scale[:, None], -FP8_MAX, FP8_MAX)
        tl.store(h_scale + rows * stride_hs + pid_n, scale, mask=row_ok)
    tl.store(h + rows[:, None] * stride_h + cols[None, :], y.to(h.dtype.element_ty), mask=out_mask)


@triton.jit
def _expert_down_fp8_kernel(
    h, h_scale, w, w_scale, weights, y, sorted_ids, block_expert,
    n_assign, num_experts, N, K,
    stride_h, stride_hs, stride_we, stride_wn, stride_se, stride_sn, stride_y,
    A_FP8: tl.constexpr, PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y[a, cols] = weights[a] · (w_out[e] · h[a]) for a block of one expert's assignments."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // num_n, pid % num_n
    e = tl.load(block_expert + pid_m).to(tl.int64)
    if e >= num_experts:
        return
    a = tl.load(sorted_ids + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = a < n_assign
    rows = a.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    h_ptrs = h + rows[:, None] * stride_h + ks[None, :]
    w_ptrs = w + e * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]
    ws_ptrs = w_scale + e * stride_se + (cols // BLOCK_K) * stride_sn
    hs_ptrs = h_scale + rows * stride_hs
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            ha = tl.load(h_ptrs, mask=row_ok[:, None], other=0.0)
            wb = tl.load(w_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = ks < K - kb * BLOCK_K
            ha = tl.load(h_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wb = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        sw = tl.load(ws_ptrs + kb, mask=col_ok, other=0.0)
        if A_FP8:
            sh = tl.load(hs_ptrs + kb, mask=row_ok, other=0.0)
            acc += tl.dot(ha, wb) * sh[:, None] * sw[None, :]
        else:
            acc += tl.dot(ha, wb.to(ha.dtype), input_precision=PRECISION) * sw[None, :]
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    scale = tl.load(weights + rows, mask=row_ok, other=0.0).to(tl.float32)
    acc = acc * scale[:, None]
    y_ptrs = y + rows[:, None] * stride_y + cols[None, :]
    tl.store(y_ptrs, acc.to(y.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def uses_fp8_dots(n_assign: int, num_experts: int) -> bool:
    """w8a8 where a row block reuses each weight tile over ≥ 64 rows (compute-bound), else w8a16."""
    return _row_block(n_assign, num_experts) >= 64


def choose_tiles(n_assign: int, num_experts: int, n: int, k: int, dtype: torch.dtype, a_fp8: bool) -> Tiles:
    """Tiles for one FP8-weight GEMM (output width n, reduction k); BLOCK_K is always the scale block."""
    if a_fp8:
        bm = _row_block(n_assign, num_experts)
        return Tiles(bm, 128, BLOCK, 8 if bm == 128 else 4, 3)
    narrow = bf16_tiles(n_assign, num_experts, n, k, dtype)
    return narrow._replace(block_k=BLOCK, num_stages=2 if dtype == torch.float32 else narrow.num_stages)


def moe_experts(
    x: Tensor,
    weights: Tensor,
    ids: Tensor,
    experts: Experts,
    up_tiles: Tiles | None = None,
    down_tiles: Tiles | None = None,
    a_fp8: bool | None = None,
) -> Tensor:
    """triton.moe_experts for FP8 stacks (same contract). `a_fp8` forces w8a8 / w8a16 (None: by the row
    block); `*_tiles` override the chosen tiles (one block_m; block_k must be 128)."""
    if not experts.fp8:
        raise ValueError("triton_fp8.moe_experts needs FP8 experts (w_in_scale / w_out_scale set)")
    t, d = x.shape
    top_k = ids.shape[1]
    w_in, w_out = experts.w_in, experts.w_out
    num_e, inter = experts.num_experts, experts.intermediate_size
    if w_in.shape[2] != d:
        raise ValueError(f"x has width {d}, the experts take {w_in.shape[2]}")
    if t == 0:
        return x.new_zeros(t, d)
    if x.stride(-1) != 1:
        x = x.contiguous()
    w_in, w_out = (w if w.stride(-1) == 1 else w.contiguous() for w in (w_in, w_out))
    s_in, s_out = experts.w_in_scale.contiguous(), experts.w_out_scale.contiguous()
    n = t * top_k
    if a_fp8 is None:
        a_fp8 = uses_fp8_dots(n, num_e)
    up = up_tiles or choose_tiles(n, num_e, inter, d, x.dtype, a_fp8)
    down = down_tiles or choose_tiles(n, num_e, d, inter, x.dtype, a_fp8)
    if up.block_m != down.block_m:
        raise ValueError(f"up and down tiles need one row block, got {up.block_m} and {down.block_m}")
    if up.block_k != BLOCK or down.block_k != BLOCK:
        raise ValueError(f"FP8 expert tiles need block_k = {BLOCK} (the scale block)")
    sorted_ids, block_expert = align(ids, num_e, up.block_m)
    blocks_m = block_expert.numel()
    precision = _precision(x.dtype)

    if a_fp8:
        xa, xs = quantize_activation(x)
    else:
        xa, xs = x, s_in  # xs unread
    fused_quant = a_fp8 and up.block_n == BLOCK  # each up tile one scale group of h
    h = torch.empty(n, inter, dtype=FP8_DTYPE if fused_quant else x.dtype, device=x.device)
    hs = s_in  # unread unless fused_quant
    if fused_quant:
        hs = torch.empty(n, triton.cdiv(inter, BLOCK), dtype=torch.float32, device=x.device)
    _expert_up_fp8_kernel[(blocks_m * triton.cdiv(inter, up.block_n),)](
        xa, xs, w_in, s_in, h, hs, sorted_ids, block_expert,
        n, top_k, num_e, inter, d,
        xa.stride(0), xs.stride(0), w_in.stride(0), w_in.stride(1), s_in.stride(0), s_in.stride(1),
        h.stride(0), hs.stride(0),
        GATED=experts.gated, ACT=experts.act, A_FP8=a_fp8, QUANT_OUT=fused_quant, PRECISION=precision,
        EVEN_K=d % BLOCK == 0, FP8_MAX=FP8_MAX, FLOOR=SCALE_FLOOR,
        BLOCK_M=up.block_m, BLOCK_N=up.block_n, BLOCK_K=BLOCK,
        num_warps=up.num_warps, num_stages=up.num_stages,
    )  # fmt: skip
    if a_fp8 and not fused_quant:
        h, hs = quantize_activation(h)
    y = torch.empty(n, d, dtype=x.dtype, device=x.device)
    _expert_down_fp8_kernel[(blocks_m * triton.cdiv(d, down.block_n),)](
        h, hs, w_out, s_out, weights.reshape(-1), y, sorted_ids, block_expert,
        n, num_e, d, inter,
        h.stride(0), hs.stride(0), w_out.stride(0), w_out.stride(1), s_out.stride(0), s_out.stride(1),
        y.stride(0),
        A_FP8=a_fp8, PRECISION=precision, EVEN_K=inter % BLOCK == 0,
        BLOCK_M=down.block_m, BLOCK_N=down.block_n, BLOCK_K=BLOCK,
        num_warps=down.num_warps, num_stages=down.num_stages,
    )  # fmt: skip
    return y.view(t, top_k, d).sum(dim=1, dtype=torch.float32).to(x.dtype)
