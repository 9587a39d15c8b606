"""The MoE experts on the GPU: two grouped GEMMs over the expert-sorted assignments (align.py), no device
wait anywhere, so a CUDA graph captures the whole layer.

    up:   h[a]  = act(w_in[e] · x[a // k])         a block of rows of one expert e; for gated experts the
                                                   gate and up tiles of one CTA share the x tile, and
                                                   silu(gate) · up is taken on the fp32 accumulators
    down: y[a]  = weights[a] · (w_out[e] · h[a])   in x's dtype, one row per assignment
    out[t]      = Σ_j y[t·k + j]                   summed in fp32 (a fixed order: deterministic)

Accumulation is fp32; bf16/fp16 operands run the tensor cores, fp32 operands full-precision fp32 dots
(no TF32). Tile sizes are chosen from the shape alone (no autotuning: a capture must not benchmark)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashstate.ops.moe.align import align_assignments, padded_length
from flashstate.ops.moe.experts import Experts


class Tiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@triton.jit
def _act(u, ACT: tl.constexpr):
    if ACT == "relu2":
        r = tl.maximum(u, 0.0)
        return r * r
    return u * tl.sigmoid(u)


@triton.jit
def _expert_up_kernel(
    x, w, h, sorted_ids, block_expert,
    n_assign, top_k, num_experts, N, K,
    stride_x, stride_we, stride_wn, stride_h,
    GATED: tl.constexpr, ACT: tl.constexpr, PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
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
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            xa = tl.load(x_ptrs, mask=row_ok[:, None], other=0.0)
            wg = tl.load(g_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = ks < K - k0
            xa = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(g_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc_g = tl.dot(xa, wg, acc_g, input_precision=PRECISION)
        if GATED:
            if EVEN_K:
                wu = tl.load(u_ptrs, mask=col_ok[None, :], other=0.0)
            else:
                wu = tl.load(u_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc_u = tl.dot(xa, wu, acc_u, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    y = _act(acc_g, ACT)
    if GATED:
        y = y * acc_u
    h_ptrs = h + a[:, None].to(tl.int64) * stride_h + cols[None, :]
    tl.store(h_ptrs, y.to(h.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _expert_down_kernel(
    h, w, weights, y, sorted_ids, block_expert,
    n_assign, num_experts, N, K,
    stride_h, stride_we, stride_wn, stride_y,
    PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
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
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            ha = tl.load(h_ptrs, mask=row_ok[:, None], other=0.0)
            wb = tl.load(w_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = ks < K - k0
            ha = tl.load(h_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wb = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(ha, wb, acc, input_precision=PRECISION)
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    scale = tl.load(weights + rows, mask=row_ok, other=0.0).to(tl.float32)
    acc = acc * scale[:, None]
    y_ptrs = y + rows[:, None] * stride_y + cols[None, :]
    tl.store(y_ptrs, acc.to(y.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _align_small_kernel(
    ids, sorted_ids, block_expert, shift, n, num_experts, rows, num_blocks,
    N_PAD: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """align.align_assignments in one CTA for n ≤ N_PAD (decode): a sort of the keys e·N_PAD + a gives the
    expert-major order, a histogram the runs; `shift` [E_PAD] is scratch for the per-expert offsets."""
    offs = tl.arange(0, N_PAD)
    ok = offs < n
    e = tl.load(ids + offs, mask=ok, other=0).to(tl.int32)
    experts = tl.arange(0, E_PAD)
    counts = tl.histogram(e, E_PAD)
    counts = tl.where(experts == 0, counts - (N_PAD - n), counts)  # the masked lanes counted as expert 0
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    run_end = tl.cumsum(padded, 0)
    first = tl.cumsum(counts, 0) - counts
    tl.store(shift + experts, run_end - padded - first)
    for r in range(0, rows, CHUNK):
        at = r + tl.arange(0, CHUNK)
        tl.store(sorted_ids + at, tl.full((CHUNK,), 0, tl.int32) + n, mask=at < rows)
    for b in range(0, num_blocks, CHUNK):
        at = b + tl.arange(0, CHUNK)
        ends = tl.broadcast_to(run_end[None, :], (CHUNK, E_PAD))
        owner = tl.sum((ends <= (at * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert + at, tl.minimum(owner, num_experts), mask=at < num_blocks)
    tl.debug_barrier()  # the sentinels and `shift` are written before the scatter reads / overwrites
    keys = tl.sort(tl.where(ok, e * N_PAD + offs, E_PAD * N_PAD + offs))
    expert, a = keys // N_PAD, keys % N_PAD
    real = offs < n
    dest = offs + tl.load(shift + expert, mask=real, other=0)
    tl.store(sorted_ids + dest, a, mask=real)


SMALL_ALIGN = 1024  # assignments up to which one CTA aligns them (decode and short mixed steps)


def align(ids: Tensor, num_experts: int, block: int) -> tuple[Tensor, Tensor]:
    """align.align_assignments (same outputs): one kernel for few assignments, torch ops beyond."""
    n = ids.numel()
    if n > SMALL_ALIGN or num_experts > 1024:
        return align_assignments(ids, num_experts, block)
    rows = padded_length(n, num_experts, block)
    e_pad = triton.next_power_of_2(num_experts)
    sorted_ids = torch.empty(rows, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(rows // block, dtype=torch.int32, device=ids.device)
    shift = torch.empty(e_pad, dtype=torch.int32, device=ids.device)
    flat = ids.reshape(-1)
    _align_small_kernel[(1,)](
        flat, sorted_ids, block_expert, shift, n, num_experts, rows, rows // block,
        N_PAD=max(16, triton.next_power_of_2(n)), E_PAD=e_pad, BLOCK_M=block, CHUNK=64, num_warps=4,
    )  # fmt: skip
    return sorted_ids, block_expert


def _row_block(n_assign: int, num_experts: int) -> int:
    """Rows per GEMM block from the mean assignments per expert: small blocks waste no rows on padding
    when experts see a few tokens each (decode), large ones reuse each weight tile over more rows."""
    per_expert = n_assign / num_experts
    if per_expert <= 16:
        return 16
    if per_expert <= 48:
        return 32
    return 64 if per_expert <= 512 else 128


def choose_tiles(n_assign: int, num_experts: int, n: int, k: int, dtype: torch.dtype) -> Tiles:
    """Tiles for one GEMM (output width n, reduction k) over n_assign assignments."""
    bm = _row_block(n_assign, num_experts)
    if dtype == torch.float32:  # fp32 dots on the FMA units: small tiles, modest shared memory
        return Tiles(bm, 32, 32, 4, 2)
    if bm <= 32:  # bandwidth-bound: enough CTAs in flight (two per SM) to stream the touched weights
        blocks_m = min(num_experts, n_assign)
        bn = next((b for b in (64, 32) if blocks_m * triton.cdiv(n, b) >= 2 * 132), 16)
        return Tiles(bm, bn, min(128, max(16, triton.next_power_of_2(k))), 4, 4)
    return Tiles(bm, 128, 64, 8 if bm == 128 else 4, 3)


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def moe_experts(
    x: Tensor,
    weights: Tensor,
    ids: Tensor,
    experts: Experts,
    up_tiles: Tiles | None = None,
    down_tiles: Tiles | None = None,
) -> Tensor:
    """Same contract as `naive.moe_experts` (the routed sum, [T, D] in x's dtype); fp32 accumulation.
    x's rows may be strided (its last dim contiguous); `*_tiles` override the chosen tiles (their
    block_m must agree)."""
    if experts.fp8:
        raise ValueError("FP8 experts run in triton_fp8.moe_experts")
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
    n = t * top_k
    up = up_tiles or choose_tiles(n, num_e, inter, d, x.dtype)
    down = down_tiles or choose_tiles(n, num_e, d, inter, x.dtype)
    if up.block_m != down.block_m:
        raise ValueError(f"up and down tiles need one row block, got {up.block_m} and {down.block_m}")
    sorted_ids, block_expert = align(ids, num_e, up.block_m)
    blocks_m = block_expert.numel()
    precision = _precision(x.dtype)

    h = torch.empty(n, inter, dtype=x.dtype, device=x.device)
    _expert_up_kernel[(blocks_m * triton.cdiv(inter, up.block_n),)](
        x, w_in, h, sorted_ids, block_expert,
        n, top_k, num_e, inter, d,
        x.stride(0), w_in.stride(0), w_in.stride(1), h.stride(0),
        GATED=experts.gated, ACT=experts.act, PRECISION=precision, EVEN_K=d % up.block_k == 0,
        BLOCK_M=up.block_m, BLOCK_N=up.block_n, BLOCK_K=up.block_k,
        num_warps=up.num_warps, num_stages=up.num_stages,
    )  # fmt: skip
    y = torch.empty(n, d, dtype=x.dtype, device=x.device)
    flat_weights = weights.reshape(-1)
    _expert_down_kernel[(blocks_m * triton.cdiv(d, down.block_n),)](
        h, w_out, flat_weights, y, sorted_ids, block_expert,
        n, num_e, d, inter,
        h.stride(0), w_out.stride(0), w_out.stride(1), y.stride(0),
        PRECISION=precision, EVEN_K=inter % down.block_k == 0,
        BLOCK_M=down.block_m, BLOCK_N=down.block_n, BLOCK_K=down.block_k,
        num_warps=down.num_warps, num_stages=down.num_stages,
    )  # fmt: skip
    return y.view(t, top_k, d).sum(dim=1, dtype=torch.float32).to(x.dtype)
