"""Copies between the device cache tensors (cache/cache_tensors.py) and host-tier object tensors.

    chunk object:  per attention layer  k [C, kv_heads, head_dim], v [C, kv_heads, v_head_dim] (no v
                                        when it is a view into k: MLA's latent)
    state object:  per linear layer     conv [*conv_state_shape], ssm [*state_shape]
                   per attention layer  k [t, kv_heads, head_dim], v [t, kv_heads, v_head_dim]  (the tail)
Device → host copies are enqueued on the current stream (ordered before any later write into the same
blocks or slot) and do not block the host; `event()` marks when they have landed. Host → device copies
of a restore run inside `side_stream()` (CUDA: a stream of their own, after the work already enqueued on
the current one), so they overlap the forward passes of other sequences. An fp8 KV cache (--kv-cache-dtype)
is moved as its bytes (`as_bytes`: torch has no float8 index_copy_); its objects' specs say float8, so they
never restore into a cache of another dtype (codec.check: "layout", and the fingerprint's cache shapes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from flashstate.cache.cache_tensors import CacheTensors, kv_tensors
from flashstate.cache.host.codec import nbytes
from flashstate.device import upload
from flashstate.ops.attention.kv_cast import as_bytes

Spec = tuple[torch.dtype, tuple[int, ...]]
Layout = tuple[int, torch.dtype, tuple[int, ...]]  # a tensor's byte offset in its object, dtype, shape


class StateTransfer:
    def __init__(self, caches: CacheTensors, block_size: int):
        self.caches = caches
        self.block_size = block_size
        tensors = [t for pair in caches.kv + caches.states for t in pair]
        self.device = tensors[0].device if tensors else torch.device("cpu")
        self._stream: torch.cuda.Stream | None = None

    def kv_specs(self, num_tokens: int) -> list[Spec]:
        return [(t.dtype, (num_tokens, *t.shape[2:])) for t in kv_tensors(self.caches.kv)]

    def state_specs(self, tail: int) -> list[Spec]:
        return [(t.dtype, tuple(t.shape[1:])) for pair in self.caches.states for t in pair] + self.kv_specs(
            tail
        )

    def num_state_tensors(self) -> int:
        return 2 * len(self.caches.states)

    # ---- device → host -----------------------------------------------------------------------------

    def gather_kv(self, blocks: list[int], num_tokens: int, out: list[Tensor]) -> None:
        """KV of the first `num_tokens` positions of `blocks` into `out` (kv_specs order)."""
        if num_tokens == 0:
            return
        idx = upload(blocks, torch.int64, self.device)
        caches = kv_tensors(self.caches.kv)
        for cache, dst in zip(caches, out, strict=True):
            as_bytes(dst).copy_(
                as_bytes(cache).index_select(0, idx).flatten(0, 1)[:num_tokens], non_blocking=True
            )

    def gather_chunks(
        self, blocks: list[int], buffers: list[Tensor], layout: list[Layout], group_bytes: int = 64 << 20
    ) -> None:
        """The KV of whole chunks into host objects laid out alike: `buffers[i]` (uint8) receives the chunk
        in blocks[i * n : (i + 1) * n] (n blocks a chunk), its tensors at `layout` (kv_specs order). Per group
        of about `group_bytes`: per KV tensor one gather into device rows shaped like the objects' bytes,
        then one device → host copy per object."""
        caches = kv_tensors(self.caches.kv)
        if not buffers or not caches:
            return
        lo, hi = layout[0][0], _extent(layout)
        per = layout[0][2][0] // self.block_size
        step = max(group_bytes // (hi - lo), 1)
        rel = [(o - lo, d, s) for o, d, s in layout]
        for g in range(0, len(buffers), step):
            group = buffers[g : g + step]
            idx = upload(blocks[g * per : (g + len(group)) * per], torch.int64, self.device)
            rows = torch.empty(len(group), _row_bytes(hi - lo), dtype=torch.uint8, device=self.device)
            for cache, view in zip(caches, _views(rows, rel, self.block_size), strict=True):
                as_bytes(view).copy_(as_bytes(cache).index_select(0, idx).view(view.shape))
            for buffer, row in zip(group, rows, strict=True):
                buffer[lo:hi].copy_(row[: hi - lo], non_blocking=True)

    def gather_state(self, slot: int, out: list[Tensor]) -> None:
        caches = [t for pair in self.caches.states for t in pair]
        for cache, dst in zip(caches, out, strict=True):
            dst.copy_(cache[slot], non_blocking=True)

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        if self.device.type != "cuda":
            yield
            return
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            yield

    def event(self) -> torch.cuda.Event | None:
        if self.device.type != "cuda":
            return None
        # blocking: the writer thread's synchronize() sleeps until the copies land instead of spinning a core
        # (68 s of CPU in a 270 s headline run)
        e = torch.cuda.Event(blocking=True)
        e.record()
        return e

    # ---- host → device -----------------------------------------------------------------------------

    def scatter_kv(self, blocks: list[int], src: list[Tensor]) -> None:
        """`src` (kv_specs order, n tokens each) into the first n positions of `blocks`."""
        caches = kv_tensors(self.caches.kv)
        b = self.block_size
        for cache, s in zip(caches, src, strict=True):
            n = s.shape[0]
            if n == 0:
                continue
            full = n // b
            s = s.to(self.device, non_blocking=True)
            if full:
                idx = upload(blocks[:full], torch.int64, self.device)
                as_bytes(cache).index_copy_(0, idx, as_bytes(s[: full * b].view(full, b, *s.shape[1:])))
            if n % b:
                cache[blocks[full], : n % b].copy_(s[full * b :])

    def scatter_pieces(
        self, blocks: list[int], pieces: list[list[Tensor]], group_bytes: int = 256 << 20
    ) -> None:
        """Consecutive KV pieces (each in kv_specs order, n_i tokens; every piece but the last a whole
        number of blocks) into `blocks` from position 0 on. Pieces laid out alike (chunk objects) go in
        groups of about `group_bytes`: one host → device copy per piece into device rows shaped like their
        bytes, then per KV tensor one scatter. Any other piece goes through one copy of its own."""
        caches, b, start, i = kv_tensors(self.caches.kv), self.block_size, 0, 0
        while caches and i < len(pieces):
            n, layout = _alike(pieces, i, b, group_bytes)
            if not n:
                self.scatter_kv(blocks[start // b :], self._to_device(pieces[i]))
                start, i = start + pieces[i][0].shape[0], i + 1
                continue
            per, size = pieces[i][0].shape[0] // b, _extent(layout)
            rows = torch.empty(n, _row_bytes(size), dtype=torch.uint8, device=self.device)
            for piece, row in zip(pieces[i : i + n], rows, strict=True):
                row[:size].copy_(_bytes(piece[0], size), non_blocking=True)
            idx = upload(blocks[start // b : start // b + n * per], torch.int64, self.device).view(n, per)
            for cache, view in zip(caches, _views(rows, layout, b), strict=True):
                as_bytes(cache)[idx] = as_bytes(view)
            start, i = start + n * per * b, i + n

    def _to_device(self, tensors: list[Tensor]) -> list[Tensor]:
        """Tensors that share one host buffer, on the device through one copy of the bytes they span."""
        live = [t for t in tensors if t.numel()]
        if len({t.untyped_storage().data_ptr() for t in live}) > 1:  # not one object's tensors
            return [t.to(self.device, non_blocking=True) for t in tensors]
        if not live:
            return [torch.empty(t.shape, dtype=t.dtype, device=self.device) for t in tensors]
        lo = min(t.storage_offset() * t.element_size() for t in live)
        hi = max((t.storage_offset() + t.numel()) * t.element_size() for t in live)
        host = torch.empty(0, dtype=torch.uint8).set_(live[0].untyped_storage())[lo:hi]
        dev = torch.empty(hi - lo, dtype=torch.uint8, device=self.device)
        dev.copy_(host, non_blocking=True)
        out = []
        for t in tensors:
            if not t.numel():
                out.append(torch.empty(t.shape, dtype=t.dtype, device=self.device))
                continue
            first = t.storage_offset() * t.element_size() - lo
            out.append(dev[first : first + t.nbytes].view(t.dtype).view(t.shape))
        return out

    def scatter_state(self, slot: int, src: list[Tensor]) -> None:
        caches = [t for pair in self.caches.states for t in pair]
        for cache, s in zip(caches, src, strict=True):
            cache[slot].copy_(s, non_blocking=True)


# ---- pieces laid out alike ------------------------------------------------------------------------------


def _layout(piece: list[Tensor], block_size: int) -> list[Layout] | None:
    """(byte offset from the first tensor, dtype, shape) of each tensor, when all lie in one buffer and hold
    the same whole number of blocks; else None."""
    first = piece[0]
    tokens = first.shape[0]
    if tokens == 0 or tokens % block_size:
        return None
    storage = first.untyped_storage().data_ptr()
    base = first.storage_offset() * first.element_size()
    out = []
    for t in piece:
        offset = t.storage_offset() * t.element_size() - base
        if (
            t.untyped_storage().data_ptr() != storage
            or t.shape[0] != tokens
            or not t.is_contiguous()
            or offset < 0
            or offset % t.element_size()
        ):
            return None
        out.append((offset, t.dtype, tuple(t.shape)))
    return out


def _alike(
    pieces: list[list[Tensor]], i: int, block_size: int, group_bytes: int
) -> tuple[int, list[Layout] | None]:
    """How many pieces from the i-th on share its layout (at least one, when it has one) and fit in about
    `group_bytes` together, and that layout; (0, None) when the i-th has none."""
    layout = _layout(pieces[i], block_size)
    if layout is None:
        return 0, None
    size = _extent(layout)
    n = 1
    while (
        i + n < len(pieces) and (n + 1) * size <= group_bytes and _layout(pieces[i + n], block_size) == layout
    ):
        n += 1
    return n, layout


def _extent(layout: list[Layout]) -> int:
    """Where the last tensor of `layout` ends."""
    return max(o + nbytes(d, s) for o, d, s in layout)


def _bytes(first: Tensor, size: int) -> Tensor:
    """`size` bytes of `first`'s buffer from where `first` starts (uint8, host)."""
    lo = first.storage_offset() * first.element_size()
    return torch.empty(0, dtype=torch.uint8).set_(first.untyped_storage())[lo : lo + size]


def _row_bytes(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


def _views(rows: Tensor, layout: list[Layout], block_size: int) -> list[Tensor]:
    """Each tensor of `layout` (offsets within a row) in every row: [rows, blocks, block_size, …]."""
    out = []
    for offset, dtype, shape in layout:
        view = rows[:, offset : offset + nbytes(dtype, shape)].view(dtype)
        out.append(view.view(rows.shape[0], shape[0] // block_size, block_size, *shape[1:]))
    return out
