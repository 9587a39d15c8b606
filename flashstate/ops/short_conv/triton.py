"""Short causal depthwise conv on the GPU (Triton), varlen with pooled conv states; same contract as
`naive.causal_conv1d`.

Token t of sequence i (local position r) reads tap j from x[t − (K − 1) + j] when r − (K − 1) + j ≥ 0, and
otherwise from column K − 1 + r − (K − 1) + j of its pool slot (zeros without an initial state). Final
and exported states are windows of the same two sources, gathered before the pool is overwritten.
"""

from __future__ import annotations

import inspect
from itertools import accumulate, pairwise

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashstate import envs
from flashstate.ops.pooled import decode_exports

# Tokens per tile, channels per tile and warps, tuned per shape on the card (a 32k prefill spent ~5× the
# conv's memory time with one fixed 32 × 128 tile, then ~4× with the token tile tuned alone); `t_bucket`
# (`_size_class`: short, middling, long batches) lets them differ. Few classes: each is tuned the first time
# a batch of its size runs (a stall of seconds inside a serving step, hence the engine's warm-up), and the
# results are kept on disk where Triton can (`cache_results`). A channel tile must divide every inner
# part boundary (`BD_MAX`, from `_tile`), and tiles stay within 16k elements (the fp32 accumulator lives
# in registers). Triton's interpreter cannot time configs (even one left by pruning): there, one config
# with the smallest channel tile, which divides every boundary `_tile` accepts.
_CONV_CONFIGS = [
    triton.Config({"BT": bt, "BD": bd}, num_warps=w)
    for bd in (128, 256, 512, 64, 32, 16)
    for bt in (32, 64, 128)
    for w in (4, 8)
    if bt * bd <= 16384
]


_INTERPRETED = envs.TRITON_INTERPRET


def _size_class(t: int) -> int:
    """The autotuning key's token-count class: < 256 tokens (decode-heavy steps), < 4,096, longer."""
    return 0 if t < 256 else 1 if t < 4096 else 2


# autotuning results on disk, reused by the next process, where this Triton can (its `cache_results`)
_TUNING_CACHE = (
    {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
)


def _prune_conv_configs(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    bd_max = named_args["BD_MAX"]
    return [c for c in configs if min(bd_max, 128) <= c.kwargs["BD"] <= bd_max]


@triton.autotune(
    configs=[triton.Config({"BT": 32, "BD": 16}, num_warps=4)] if _INTERPRETED else _CONV_CONFIGS,
    key=["D", "split_a", "split_b", "t_bucket", "K", "BD_MAX"],
    prune_configs_by={"early_config_prune": _prune_conv_configs},
    **_TUNING_CACHE,
)
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
    split_a,
    split_b,
    t_bucket,
    stride_x_t,
    stride_pool_s,
    stride_pool_d,
    BD_MAX,
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
    # only a tile holding one of a sequence's first K - 1 tokens reaches into a pool slot (rare in a long
    # prefill): every other tile skips the pool's gathers and their address arithmetic
    reaches_pool = tl.min(tl.where(t_ok, local, K), axis=0) < K - 1
    acc = tl.zeros([BT, BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    # two copies of the tap loop: a branch inside it would keep each tap's load waiting for the previous
    # tap's product, while the straight-line common copy issues all K loads at once
    if reaches_pool:
        for j in tl.static_range(K):
            row = t - (K - 1) + j
            xm = (t_ok & (row >= 0))[:, None] & d_ok[None, :]
            xv = tl.load(x + row.to(tl.int64)[:, None] * stride_x_t + d[None, :], mask=xm, other=0.0)
            pos = local - (K - 1) + j
            in_x = pos >= 0
            slot = tl.load(indices + seq, mask=t_ok, other=0).to(tl.int64)
            has = tl.load(has_initial + seq, mask=t_ok, other=0) != 0
            sm = (t_ok & ~in_x & has)[:, None] & d_ok[None, :]
            col = tl.maximum(K - 1 + pos, 0)
            sv = tl.load(
                pool + slot[:, None] * stride_pool_s + d[None, :] * stride_pool_d + col[:, None],
                mask=sm,
                other=0.0,
            )
            # a row of the previous sequence was read from x: the pool's value replaces it
            xv = tl.where(in_x[:, None], xv.to(tl.float32), sv.to(tl.float32))
            w = tl.load(weight + d * K + j, mask=d_ok, other=0.0).to(tl.float32)
            acc += xv * w[None, :]
    else:
        for j in tl.static_range(K):
            row = t - (K - 1) + j
            xm = t_ok[:, None] & d_ok[None, :]
            xr = tl.load(x + row.to(tl.int64)[:, None] * stride_x_t + d[None, :], mask=xm, other=0.0)
            wr = tl.load(weight + d * K + j, mask=d_ok, other=0.0).to(tl.float32)
            acc += xr.to(tl.float32) * wr[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    # y holds channels [lo, hi) of this tile's part as its own contiguous [T, hi - lo] block at T · lo;
    # parts are [0, split_a), [split_a, split_b), [split_b, D), and a tile never straddles two
    d0 = tl.program_id(1) * BD
    lo = tl.where(d0 < split_a, 0, tl.where(d0 < split_b, split_a, split_b)).to(tl.int64)
    hi = tl.where(d0 < split_a, split_a, tl.where(d0 < split_b, split_b, D)).to(tl.int64)
    tl.store(
        y + lo * T + t.to(tl.int64)[:, None] * (hi - lo) + (d[None, :] - lo),
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


@triton.jit
def _conv_update_kernel(
    x,
    weight,
    bias,
    y,
    pool,
    indices,
    has_initial,
    T,
    D,
    split_a,
    split_b,
    stride_x_t,
    stride_pool_s,
    stride_pool_d,
    K: tl.constexpr,
    KP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BD: tl.constexpr,
):
    # one token per sequence (a decode batch): row i is sequence i; its slot's window [D, K - 1] (oldest
    # input first) gives taps 0..K-2, the token tap K-1; the slot then shifts by one and takes the token.
    # Every load of the slot precedes the store into it.
    i = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    c = tl.arange(0, KP)
    d_ok = d < D
    slot = tl.load(indices + i).to(tl.int64)
    has = tl.load(has_initial + i) != 0
    cell = pool + slot * stride_pool_s + d[:, None] * stride_pool_d + c[None, :]
    in_window = d_ok[:, None] & (c < K - 1)[None, :]
    window = tl.load(cell, mask=in_window & has, other=0.0)
    ahead = tl.load(cell + 1, mask=d_ok[:, None] & (c < K - 2)[None, :] & has, other=0.0)
    xv = tl.load(x + i * stride_x_t + d, mask=d_ok, other=0.0)
    w = tl.load(weight + d[:, None] * K + c[None, :], mask=in_window, other=0.0).to(tl.float32)
    acc = tl.sum(window.to(tl.float32) * w, axis=1)
    acc += xv.to(tl.float32) * tl.load(weight + d * K + K - 1, mask=d_ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + d, mask=d_ok, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    shifted = tl.where((c == K - 2)[None, :], xv.to(pool.dtype.element_ty)[:, None], ahead)
    tl.store(cell, shifted, mask=in_window)
    d0 = tl.program_id(1) * BD
    lo = tl.where(d0 < split_a, 0, tl.where(d0 < split_b, split_a, split_b)).to(tl.int64)
    hi = tl.where(d0 < split_a, split_a, tl.where(d0 < split_b, split_b, D)).to(tl.int64)
    tl.store(y + lo * T + i * (hi - lo) + (d - lo), acc.to(y.dtype.element_ty), mask=d_ok)


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
    token_seqs: Tensor | None = None,
    span_ends: Tensor | None = None,
    export_token_ids: Tensor | None = None,
    activation: str | None = "silu",
    out_splits: list[int] | None = None,
) -> tuple[Tensor | tuple[Tensor, ...], Tensor]:
    """x: [T, D] (rows may be strided, channels contiguous); weight: [D, K]; conv_state_pool: [S, D, K − 1].
    Returns y: [T, D] (with `out_splits`, one contiguous [T, s] tensor per part) and the exported conv
    states [E, D, K − 1]; pool slots get each span's last inputs."""
    if activation not in ("silu", None):
        raise ValueError(f"unsupported activation {activation!r}")
    t_total, dim = x.shape
    bounds = _split_bounds(out_splits, dim)
    bd = _tile(bounds, dim)
    if bd is None:  # parts not aligned to a channel tile: compute [T, D], then copy the parts out
        y, exported = causal_conv1d(
            x, weight, bias, conv_state_pool=conv_state_pool, state_indices=state_indices,
            has_initial_state=has_initial_state, cu_seqlens=cu_seqlens, token_seqs=token_seqs,
            span_ends=span_ends, export_token_ids=export_token_ids, activation=activation,
        )  # fmt: skip
        assert isinstance(y, Tensor) and out_splits is not None
        return tuple(p.contiguous() for p in y.split(out_splits, dim=-1)), exported
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
    flat = torch.empty(t_total * dim, dtype=x.dtype, device=x.device)
    n = idx.shape[0]
    e = None  # the exported tokens
    if export_token_ids is not None and export_token_ids.numel():
        e = export_token_ids.to(device=x.device, dtype=torch.long)
    exported = conv_state_pool.new_empty((0, dim, width))
    if t_total == n and n:  # one token per sequence (spans are never empty): update the slots in place
        bd_update = min(bd, 256)
        _conv_update_kernel[(n, triton.cdiv(dim, bd_update))](
            x, weight, bias if bias is not None else weight, flat, conv_state_pool, idx, has, t_total, dim,
            bounds[0], bounds[1], x.stride(0), conv_state_pool.stride(0), conv_state_pool.stride(1),
            K=kernel, KP=triton.next_power_of_2(width), HAS_BIAS=bias is not None,
            SILU=activation == "silu", BD=bd_update,
        )  # fmt: skip
        return _parts(flat, t_total, dim, out_splits), decode_exports(conv_state_pool, idx, e)
    if token_seqs is not None:  # the metadata's, built on the host
        seq_of_token = token_seqs.to(device=x.device, dtype=torch.long)
    else:
        seq_of_token = torch.searchsorted(cu, torch.arange(t_total, device=x.device), right=True) - 1
    if t_total:
        grid = lambda meta: (triton.cdiv(t_total, meta["BT"]), triton.cdiv(dim, meta["BD"]))  # noqa: E731
        _conv_kernel[grid](
            x,
            weight,
            bias if bias is not None else weight,
            flat,
            conv_state_pool,
            seq_of_token,
            cu,
            idx,
            has,
            t_total,
            dim,
            bounds[0],
            bounds[1],
            _size_class(t_total),
            x.stride(0),
            conv_state_pool.stride(0),
            conv_state_pool.stride(1),
            bd,
            K=kernel,
            HAS_BIAS=bias is not None,
            SILU=activation == "silu",
        )
    if e is not None:
        exported = _windows(x, conv_state_pool, cu, idx, has, seq_of_token[e], e, e.shape[0])
    if span_ends is None:
        finals = _windows(x, conv_state_pool, cu, idx, has, None, None, n)
    else:  # a span padded past its real end keeps the window ending at its last real token
        ends = span_ends.to(device=x.device, dtype=torch.long)
        finals = _windows(x, conv_state_pool, cu, idx, has, torch.arange(n, device=x.device), ends, n)
    conv_state_pool.index_copy_(0, idx, finals)
    return _parts(flat, t_total, dim, out_splits), exported


def _parts(flat: Tensor, t_total: int, dim: int, out_splits: list[int] | None) -> Tensor | tuple[Tensor, ...]:
    """The kernel's output: [T, D], or one contiguous [T, s] tensor per part laid end to end."""
    if out_splits is None:
        return flat.view(t_total, dim)
    edges = [0, *accumulate(out_splits)]
    return tuple(flat[t_total * a : t_total * b].view(t_total, b - a) for a, b in pairwise(edges))


def _split_bounds(out_splits: list[int] | None, dim: int) -> tuple[int, int]:
    """The kernel's two inner part boundaries (split_a, split_b), D standing for "no boundary"."""
    if out_splits is None:
        return dim, dim
    if sum(out_splits) != dim or not 1 <= len(out_splits) <= 3 or min(out_splits) < 1:
        raise ValueError(f"out_splits {out_splits} must be 1 to 3 positive parts summing to {dim}")
    inner = [*accumulate(out_splits)][:-1] + [dim, dim]
    return inner[0], inner[1]


def _tile(bounds: tuple[int, int], dim: int) -> int | None:
    """The largest channel tile: 512, or the largest power of two ≥ 16 dividing every inner part boundary
    (a tile never straddles two parts); None if there is none."""
    bd = 512
    while bd >= 16:
        if all(b % bd == 0 for b in bounds if b < dim):
            return bd
        bd //= 2
    return None
