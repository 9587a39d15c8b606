"""Short causal depthwise conv on the GPU (Triton), varlen with pooled conv states; same contract as
`naive.causal_conv1d`.

Token t of sequence i (local position r) reads tap j from x[t − (K − 1) + j] when r − (K − 1) + j ≥ 0, and
otherwise from column K − 1 + r − (K − 1) + j of its pool slot (zeros without an initial state). Final
and exported states are windows of the same two sources, gathered before the pool is overwritten.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _conv_kernel(
    x,
    weight,
    bias,
    y,
    pool,
    seq_of_token,
    cu_seqlens,
    indices,
    has_initial,
    T,
    D,
    stride_x_t,
    stride_y_t,
    stride_pool_s,
    stride_pool_d,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BT: tl.constexpr,
    BD: tl.constexpr,
):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    t_ok, d_ok = t < T, d < D
    seq = tl.load(seq_of_token + t, mask=t_ok, other=0)
    local = t - tl.load(cu_seqlens + seq, mask=t_ok, other=0)
    slot = tl.load(indices + seq, mask=t_ok, other=0).to(tl.int64)
    has = tl.load(has_initial + seq, mask=t_ok, other=0) != 0
    acc = tl.zeros([BT, BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(K):
        pos = local - (K - 1) + j
        in_x = pos >= 0
        xm = (t_ok & in_x)[:, None] & d_ok[None, :]
        xv = tl.load(
            x + (t - (K - 1) + j).to(tl.int64)[:, None] * stride_x_t + d[None, :], mask=xm, other=0.0
        )
        sm = (t_ok & ~in_x & has)[:, None] & d_ok[None, :]
        col = tl.maximum(K - 1 + pos, 0)
        sv = tl.load(
            pool + slot[:, None] * stride_pool_s + d[None, :] * stride_pool_d + col[:, None],
            mask=sm,
            other=0.0,
        )
        w = tl.load(weight + d * K + j, mask=d_ok, other=0.0).to(tl.float32)
        acc += (xv.to(tl.float32) + sv.to(tl.float32)) * w[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(
        y + t.to(tl.int64)[:, None] * stride_y_t + d[None, :],
        acc.to(y.dtype.element_ty),
        mask=t_ok[:, None] & d_ok[None, :],
    )


@triton.jit
def _window_kernel(
    x,
    pool,
    out,
    seq_of_row,
    last_of_row,
    cu_seqlens,
    indices,
    has_initial,
    D,
    stride_x_t,
    stride_pool_s,
    stride_pool_d,
    W: tl.constexpr,
    ROW_IS_SEQ: tl.constexpr,
    BD: tl.constexpr,
):
    # row m: the W inputs up to and including its last token, reaching into the old pool slot
    m = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    d_ok = d < D
    if ROW_IS_SEQ:  # the final state of sequence m
        seq = m
        last = tl.load(cu_seqlens + m + 1).to(tl.int64) - 1
    else:
        seq = tl.load(seq_of_row + m).to(tl.int64)
        last = tl.load(last_of_row + m).to(tl.int64)
    local = last - tl.load(cu_seqlens + seq).to(tl.int64)
    slot = tl.load(indices + seq).to(tl.int64)
    has = tl.load(has_initial + seq) != 0
    for w in tl.static_range(W):
        pos = local - (W - 1) + w
        dst = out + (m * D + d) * W + w
        if pos >= 0:
            xv = tl.load(x + (last - (W - 1) + w) * stride_x_t + d, mask=d_ok, other=0.0)
            tl.store(dst, xv.to(out.dtype.element_ty), mask=d_ok)
        else:
            sv = tl.load(
                pool + slot * stride_pool_s + d * stride_pool_d + W + pos, mask=d_ok & has, other=0.0
            )
            tl.store(dst, sv.to(out.dtype.element_ty), mask=d_ok)


def _windows(
    x: Tensor,
    pool: Tensor,
    cu: Tensor,
    idx: Tensor,
    has: Tensor,
    seq: Tensor | None,
    last: Tensor | None,
    rows: int,
) -> Tensor:
    """[rows, D, W] conv-state windows; `seq`/`last` None means row m is the final state of sequence m."""
    dim, width = x.shape[1], pool.shape[2]
    out = torch.empty((rows, dim, width), dtype=pool.dtype, device=x.device)
    if rows:
        bd = 256
        _window_kernel[(rows, triton.cdiv(dim, bd))](
            x,
            pool,
            out,
            cu if seq is None else seq,
            cu if last is None else last,
            cu,
            idx,
            has,
            dim,
            x.stride(0),
            pool.stride(0),
            pool.stride(1),
            W=width,
            ROW_IS_SEQ=seq is None,
            BD=bd,
        )
    return out


def causal_conv1d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    *,
    conv_state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    cu_seqlens: Tensor,
    export_token_ids: Tensor | None = None,
    activation: str | None = "silu",
) -> tuple[Tensor, Tensor]:
    """x: [T, D] (rows may be strided, channels contiguous); weight: [D, K]; conv_state_pool: [S, D, K − 1].
    Returns y: [T, D] and the exported conv states [E, D, K − 1]; pool slots get each span's last inputs."""
    if activation not in ("silu", None):
        raise ValueError(f"unsupported activation {activation!r}")
    t_total, dim = x.shape
    kernel = weight.shape[1]
    width = kernel - 1
    cu = cu_seqlens.to(device=x.device, dtype=torch.long)
    if conv_state_pool.stride(2) != 1:
        raise ValueError("conv state pool must be contiguous along its last dim")
    if x.stride(1) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    idx = state_indices.to(device=x.device, dtype=torch.long)
    has = has_initial_state.to(device=x.device)
    seq_of_token = torch.searchsorted(cu, torch.arange(t_total, device=x.device), right=True) - 1
    y = torch.empty((t_total, dim), dtype=x.dtype, device=x.device)
    if t_total:
        bt, bd = 32, 128
        grid = (triton.cdiv(t_total, bt), triton.cdiv(dim, bd))
        _conv_kernel[grid](
            x,
            weight,
            bias if bias is not None else weight,
            y,
            conv_state_pool,
            seq_of_token,
            cu,
            idx,
            has,
            t_total,
            dim,
            x.stride(0),
            y.stride(0),
            conv_state_pool.stride(0),
            conv_state_pool.stride(1),
            K=kernel,
            HAS_BIAS=bias is not None,
            SILU=activation == "silu",
            BT=bt,
            BD=bd,
        )
    n = idx.shape[0]
    if export_token_ids is None or export_token_ids.numel() == 0:
        exported = conv_state_pool.new_empty((0, dim, width))
    else:
        e = export_token_ids.to(device=x.device, dtype=torch.long)
        exported = _windows(x, conv_state_pool, cu, idx, has, seq_of_token[e], e, e.shape[0])
    finals = _windows(x, conv_state_pool, cu, idx, has, None, None, n)
    conv_state_pool.index_copy_(0, idx, finals)
    return y, exported
