"""Paged attention in Triton: causal GQA over a varlen batch, K/V read through block tables (prefill of
new tokens over a cached prefix, and decode). Same contract as `naive.paged_attention` / `naive.store_kv`.

One program owns a tile of BM rows of one KV head: rows are (token, query head of that KV head's group)
pairs, `BM // G` consecutive tokens of one sequence, so each K/V tile read serves the whole group. Token j
of a span of length L in a context of C sits at position C − L + j and sees keys [0, C − L + j]. Keys
below the tile's first position are seen by every row and run unmasked; the rest run with the causal
mask. Decode batches (one token per sequence) split the keys into `splits` ranges whose partial results
(unnormalised output, running max, running sum) are merged afterwards (flash-decoding).
Softmax in base 2: scores are scaled by scale·log2(e).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashstate.ops.attention.kv_cast import as_bytes, to_kv_cache
from flashstate.ops.attention.tiles import tile_list

SMEM_BUDGET = 200 * 1024  # bytes of shared memory a tile may plan for (the H100/H200 allow 227 KiB)

LOG2E = 1.4426950408889634
MIN_SPLIT_KEYS = 256  # at 1,024 a 32k-token decode with 2 KV heads got 66 programs, 1.0 TB/s (BENCHMARKS)


@functools.cache
def num_sms(device: torch.device) -> int:
    """The device's streaming multiprocessors (132 on the H200): only shapes the decode split count."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def store_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """k: [T, Hkv, D]; k_cache: [num_blocks, block_size, Hkv, D]; token t goes to slot slot_mapping[t]."""
    slots = slot_mapping.to(device=k.device, dtype=torch.long)
    for x, cache in ((k, k_cache), (v, v_cache)):  # fp8 rows go as bytes: index_copy_ has no float8 kernel
        rows = as_bytes(cache.view(-1, *cache.shape[2:]))
        rows.index_copy_(0, slots, as_bytes(to_kv_cache(x, cache.dtype)))


@triton.jit
def _tile_step(
    acc,
    m_i,
    l_i,
    q,
    q2,
    k_cache,
    v_cache,
    table_row,
    kvh,
    n,
    key_end,
    qpos,
    stride_kb,
    stride_ko,
    stride_kh,
    stride_vb,
    stride_vo,
    stride_vh,
    qk_scale,
    PAGE: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    BD: tl.constexpr,
    BD2: tl.constexpr,
    BDV: tl.constexpr,
    BN: tl.constexpr,
    MASKED: tl.constexpr,
):
    keys = n + tl.arange(0, BN)
    key_ok = keys < key_end
    page = tl.load(table_row + keys // PAGE, mask=key_ok, other=0).to(tl.int64)
    off = (keys % PAGE).to(tl.int64)
    dk = tl.arange(0, BD)
    k_row = k_cache + page[None, :] * stride_kb + off[None, :] * stride_ko + kvh * stride_kh
    # an fp8 cache is upcast to q's dtype as it is read (a no-op for a cache in q's dtype)
    k = tl.load(k_row + dk[:, None], mask=key_ok[None, :] & (dk[:, None] < D), other=0.0).to(q.dtype)
    s = tl.dot(q, k)
    if BD2 > 0:  # a head dim past the largest power of two in it (MLA's latent + rope): its remainder
        dk2 = BD + tl.arange(0, BD2)
        k2 = tl.load(k_row + dk2[:, None], mask=key_ok[None, :] & (dk2[:, None] < D), other=0.0).to(q.dtype)
        s += tl.dot(q2, k2)
    s = s * qk_scale
    if MASKED:
        s = tl.where((keys[None, :] <= qpos[:, None]) & key_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    dv = tl.arange(0, BDV)
    v_ptrs = v_cache + page[:, None] * stride_vb + off[:, None] * stride_vo + kvh * stride_vh + dv[None, :]
    v = tl.load(v_ptrs, mask=key_ok[:, None] & (dv[None, :] < DV), other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
    return acc, m_new, l_i


# Arguments that change from step to step are not specialised (== 1, divisible by 16): each new combination
# was a variant compiled inside a served step, which the warm-up cannot enumerate.
@triton.jit(do_not_specialize=["num_tiles", "stride_bt", "T"])
def _paged_attention_kernel(
    q,
    k_cache,
    v_cache,
    out,
    part_acc,
    part_ml,
    cu_seqlens,
    context_lens,
    block_tables,
    tile_seq,
    tile_tok,
    qk_scale,
    kv_per_split,
    num_tiles,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ko,
    stride_kh,
    stride_vb,
    stride_vo,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_bt,
    T,
    HQ,
    G: tl.constexpr,
    PAGE: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    BD: tl.constexpr,
    BD2: tl.constexpr,
    BDV: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    SPLIT: tl.constexpr,
    DECODE: tl.constexpr,
):
    tile = num_tiles - 1 - tl.program_id(0)  # last tiles (most keys) first
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    if DECODE:  # one token per sequence: tile i is sequence i
        seq = tile
        tok0 = 0
    else:
        seq = tl.load(tile_seq + tile)
        if seq < 0:
            return
        tok0 = tl.load(tile_tok + tile)
    bos = tl.load(cu_seqlens + seq)
    span = tl.load(cu_seqlens + seq + 1) - bos
    ctx = tl.load(context_lens + seq)

    rows = tl.arange(0, BM)
    tok = tok0 + rows // G
    head = kvh * G + rows % G
    row_ok = (tok < span) & (rows // G < BM // G)
    qpos = ctx - span + tok
    dq = tl.arange(0, BD)
    q_row = q + (bos + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
    qt = tl.load(q_row + dq[None, :], mask=row_ok[:, None] & (dq[None, :] < D), other=0.0)
    qt2 = qt
    if BD2 > 0:
        dq2 = BD + tl.arange(0, BD2)
        qt2 = tl.load(q_row + dq2[None, :], mask=row_ok[:, None] & (dq2[None, :] < D), other=0.0)

    first_pos = ctx - span + tok0
    last_pos = ctx - span + tl.minimum(tok0 + BM // G, span) - 1
    lo, hi = 0, last_pos + 1  # keys this tile needs
    if SPLIT:
        lo = split * kv_per_split
        hi = tl.minimum(hi, lo + kv_per_split)
    full_end = tl.maximum(tl.minimum((first_pos + 1) // BN * BN, hi), lo)  # [lo, full_end) needs no mask

    table_row = block_tables + seq.to(tl.int64) * stride_bt
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    for n in range(lo, full_end, BN):
        acc, m_i, l_i = _tile_step(
            acc,
            m_i,
            l_i,
            qt,
            qt2,
            k_cache,
            v_cache,
            table_row,
            kvh,
            n,
            full_end,
            qpos,
            stride_kb,
            stride_ko,
            stride_kh,
            stride_vb,
            stride_vo,
            stride_vh,
            qk_scale,
            PAGE,
            D,
            DV,
            BD,
            BD2,
            BDV,
            BN,
            False,
        )
    for n in range(full_end, hi, BN):
        acc, m_i, l_i = _tile_step(
            acc,
            m_i,
            l_i,
            qt,
            qt2,
            k_cache,
            v_cache,
            table_row,
            kvh,
            n,
            hi,
            qpos,
            stride_kb,
            stride_ko,
            stride_kh,
            stride_vb,
            stride_vo,
            stride_vh,
            qk_scale,
            PAGE,
            D,
            DV,
            BD,
            BD2,
            BDV,
            BN,
            True,
        )

    dv = tl.arange(0, BDV)
    t_glob = (bos + tok).to(tl.int64)
    if SPLIT:
        base = (split * T + t_glob) * HQ + head  # [BM] into [splits, T, HQ]
        tl.store(part_acc + base[:, None] * DV + dv[None, :], acc, mask=row_ok[:, None] & (dv[None, :] < DV))
        tl.store(part_ml + base * 2, m_i, mask=row_ok)
        tl.store(part_ml + base * 2 + 1, l_i, mask=row_ok)
    else:
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_ptrs = out + t_glob[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :]
        tl.store(o_ptrs, o.to(out.dtype.element_ty), mask=row_ok[:, None] & (dv[None, :] < DV))


@triton.jit
def _merge_splits_kernel(
    part_acc, part_ml, out, splits, rows, HQ, stride_ot, stride_oh, DV: tl.constexpr, BDV: tl.constexpr
):
    r = tl.program_id(0).to(tl.int64)  # row = token · HQ + head
    dv = tl.arange(0, BDV)
    top = tl.load(part_ml + r * 2)  # split 0 always holds key 0, which every query sees
    for sp in range(1, splits):
        top = tl.maximum(top, tl.load(part_ml + (sp * rows + r) * 2))
    acc = tl.zeros([BDV], dtype=tl.float32)
    total = tl.sum(acc, 0)
    for sp in range(splits):
        m = tl.load(part_ml + (sp * rows + r) * 2)
        w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - top))
        total += w * tl.load(part_ml + (sp * rows + r) * 2 + 1)
        acc += w * tl.load(part_acc + (sp * rows + r) * DV + dv, mask=dv < DV, other=0.0)
    o_ptrs = out + (r // HQ) * stride_ot + (r % HQ) * stride_oh + dv
    tl.store(o_ptrs, (acc / total).to(out.dtype.element_ty), mask=dv < DV)


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    *,
    cu_seqlens: Tensor,
    context_lens: Tensor,
    block_tables: Tensor,
    scale: float,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    kv_splits: int | None = None,
) -> Tensor:
    """q: [T, Hq, D]; k_cache: [num_blocks, block_size, Hkv, D]; v_cache: [.., Hkv, Dv]; cu_seqlens: [N + 1];
    context_lens: [N]; block_tables: [N, max_blocks]. Span i holds the last cu[i+1] − cu[i] positions of
    its context_lens[i]; the caches may be fp8 (read upcast to q's dtype). Returns [T, Hq, Dv] in q's
    dtype. block_m/block_n/num_warps/num_stages override the tiling, kv_splits the decode key split (for
    tuning and tests)."""
    t_total, hq, d = q.shape
    page, hkv, dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[-1]
    if hq % hkv:
        raise ValueError(f"{hq} query heads cannot share {hkv} KV heads")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("paged attention needs the head dim contiguous")
    g = hq // hkv
    n = cu_seqlens.shape[0] - 1
    out = q.new_empty((t_total, hq, dv))
    if t_total == 0:
        return out
    decode = n == t_total  # spans are never empty, so this is one token per sequence
    bd, bd2, bdv = _head_tiles(d), 0, triton.next_power_of_2(dv)
    if bd < d:
        bd2 = triton.next_power_of_2(d - bd)
    bm = block_m or (max(16, triton.next_power_of_2(g)) if decode else 128)
    bn = block_n or (64 if decode or bd > 128 else 128)
    warps = num_warps or (8 if bdv >= 512 else 4 if decode else 8)
    stages = num_stages or (2 if bd > 128 else 3)
    if q.element_size() > 2 or bd2:
        # The tiles above are tuned for 16-bit inputs up to head dim 256; fp32 ones (the exactness checks)
        # and MLA's latent heads (576 / 512) take more shared memory: shrink until the q tile plus
        # `stages` K/V tiles fit (measured: fp32, d 256, 128×64 tiles asked for 384 KiB).
        smem = lambda m, nk: (m * (bd + bd2) + stages * nk * (bd + bd2 + bdv)) * q.element_size()  # noqa: E731
        while block_n is None and bn > 16 and smem(bm, bn) > SMEM_BUDGET:
            bn //= 2
        while block_m is None and not decode and bm > max(16, g) and smem(bm, bn) > SMEM_BUDGET:
            bm //= 2
    if bm < g:
        raise ValueError(f"block_m {bm} is smaller than the GQA group {g}")
    cu = cu_seqlens.to(device=q.device)
    if decode:  # tile i = sequence i; no tile list to build
        num_tiles = n
        tile_seq = tile_tok = cu
    else:
        num_tiles = t_total // (bm // g) + n + 1
        tile_seq, tile_tok = tile_list(cu.long(), bm // g, num_tiles)
    max_keys = block_tables.shape[1] * page
    splits = 1
    if decode:  # ~4 programs per SM; at least MIN_SPLIT_KEYS keys each (few sequences need many splits)
        per_sm = triton.cdiv(4 * num_sms(q.device), max(1, n * hkv))
        splits = max(1, min(triton.cdiv(max_keys, MIN_SPLIT_KEYS), per_sm))
    splits = kv_splits or splits
    kv_per_split = triton.cdiv(triton.cdiv(max_keys, splits), bn) * bn
    if splits > 1:
        part_acc = torch.empty((splits, t_total, hq, dv), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((splits, t_total, hq, 2), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out
    _paged_attention_kernel[(num_tiles, hkv, splits)](
        q,
        k_cache,
        v_cache,
        out,
        part_acc,
        part_ml,
        cu,
        context_lens.to(device=q.device),
        block_tables,
        tile_seq,
        tile_tok,
        scale * LOG2E,
        kv_per_split,
        num_tiles,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        t_total,
        hq,
        G=g,
        PAGE=page,
        D=d,
        DV=dv,
        BD=bd,
        BD2=bd2,
        BDV=bdv,
        BM=bm,
        BN=bn,
        SPLIT=splits > 1,
        DECODE=decode,
        num_warps=warps,
        num_stages=stages,
    )
    if splits > 1:
        rows = t_total * hq
        _merge_splits_kernel[(rows,)](
            part_acc, part_ml, out, splits, rows, hq, out.stride(0), out.stride(1), DV=dv, BDV=bdv
        )
    return out


def _head_tiles(d: int) -> int:
    """The q·k head dim's first tile: the next power of two up to 256; past 256 (MLA's 512 + 64), the
    largest power of two in it, the kernel taking the remainder as a second tile."""
    if d <= 256:
        return triton.next_power_of_2(d)
    return 1 << (d.bit_length() - 1)
