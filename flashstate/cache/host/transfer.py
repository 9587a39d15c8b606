"""Copies between the device cache tensors (engine/cache_tensors.py) and host-tier object tensors.

    chunk object:  per attention layer  k [C, kv_heads, head_dim], v [C, kv_heads, v_head_dim] (no v
                                        when it is a view into k: MLA's latent)
    state object:  per linear layer     conv [*conv_state_shape], ssm [*state_shape]
                   per attention layer  k [t, kv_heads, head_dim], v [t, kv_heads, v_head_dim]  (the tail)
Device → host copies are enqueued on the current stream (ordered before any later write into the same
blocks or slot) and do not block the host; `event()` marks when they have landed. Host → device copies
of a restore run inside `side_stream()` (CUDA: a stream of their own, after the work already enqueued on
the current one), so they overlap the forward passes of other sequences.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from flashstate.device import upload
from flashstate.engine.cache_tensors import CacheTensors, kv_tensors

Spec = tuple[torch.dtype, tuple[int, ...]]


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
            dst.copy_(cache.index_select(0, idx).flatten(0, 1)[:num_tokens], non_blocking=True)

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
        e = torch.cuda.Event()
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
                cache.index_copy_(0, idx, s[: full * b].view(full, b, *s.shape[1:]))
            if n % b:
                cache[blocks[full], : n % b].copy_(s[full * b :])

    def scatter_pieces(
        self, blocks: list[int], pieces: list[list[Tensor]], group_bytes: int = 256 << 20
    ) -> None:
        """Consecutive KV pieces (each in kv_specs order, n_i tokens; every piece but the last a whole
        number of blocks) into `blocks` from position 0 on. Per group of pieces (about `group_bytes`): one
        host → device copy per piece, then per layer one concatenation and one scatter."""
        if not self.caches.kv:
            return
        b, start, group, size = self.block_size, 0, [], 0
        for i, piece in enumerate(pieces):
            group.append(piece)
            size += sum(t.nbytes for t in piece)
            if size >= group_bytes or i == len(pieces) - 1:
                staged = [self._to_device(p) for p in group]
                srcs = [torch.cat([p[j] for p in staged]) for j in range(len(staged[0]))]
                self.scatter_kv(blocks[start // b :], srcs)
                start += srcs[0].shape[0]
                group, size = [], 0

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
