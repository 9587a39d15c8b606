"""Drive a model through the paged varlen path without the engine: test-only block/slot bookkeeping."""

from __future__ import annotations

import torch
from torch import Tensor

from flashstate.cache.cache_tensors import CacheTensors
from flashstate.layers.metadata import ForwardMetadata
from flashstate.models.base import HybridForCausalLM


class PagedHarness:
    """Each sequence id owns a list of blocks and one working state slot; slots [num_seqs, ...) are free
    for exports."""

    def __init__(
        self,
        model: HybridForCausalLM,
        block_size: int = 4,
        num_blocks: int = 512,
        num_slots: int = 32,
        dtype: torch.dtype = torch.float32,
    ):
        self.model = model
        self.block_size = block_size
        self.caches = CacheTensors.allocate(model.spec, num_blocks, block_size, num_slots, dtype)
        self.caches.bind(model)
        self.next_block = 1  # block 0 stays unused so padding never aliases a real block
        self.blocks: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}
        self.slots: dict[int, int] = {}

    def _reserve(self, seq: int, total: int) -> None:
        table = self.blocks.setdefault(seq, [])
        while len(table) * self.block_size < total:
            table.append(self.next_block)
            self.next_block += 1

    @torch.no_grad()
    def step(
        self,
        batch: dict[int, list[int]],
        exports: list[tuple[int, int, int]] | None = None,
        pad: int | list[int] = 0,
    ) -> list[Tensor]:
        """Feed new tokens per sequence id (a sequence id's slot is the id itself); returns per-sequence
        logits [L, vocab]. `exports`: (sequence id, tokens of its span, destination slot). `pad`: tokens
        run after the last sequence's, or a list: after each one's (ForwardMetadata's padding; their logits
        are not returned)."""
        self.caches.bind(self.model)  # another harness on the same model may have rebound its caches
        ids = list(batch)
        query, context, tables, slots = [], [], [], []
        for seq in ids:
            n = len(batch[seq])
            total = self.lens.get(seq, 0) + n
            self._reserve(seq, total)
            query.append(n)
            context.append(total)
            tables.append(self.blocks[seq])
            slots.append(seq)
        meta = ForwardMetadata.build(
            query,
            context,
            tables,
            self.block_size,
            slots,
            exports=[(ids.index(s), n, dst) for s, n, dst in exports or []],
            pad=pad,
            pad_block=self.caches.pad_block if pad else None,
        )
        pads = pad if isinstance(pad, list) else [0] * (len(ids) - 1) + [pad]
        spans = [batch[s] + [0] * p for s, p in zip(ids, pads, strict=True)]
        tokens = torch.tensor([t for span in spans for t in span], dtype=torch.long)
        logits = self.model.compute_logits(self.model(tokens, meta))
        for seq, total in zip(ids, context, strict=True):
            self.lens[seq] = total
        cu = meta.cu_seqlens.tolist()
        return [logits[cu[i] : cu[i + 1] - pads[i]] for i in range(len(ids))]

    def fork(self, src: int, dst: int, from_slot: int | None = None, length: int | None = None) -> None:
        """Start sequence `dst` from the KV of `src`'s first `length` tokens and the state in `from_slot`
        (default: src's working slot): shares block ids, copies the state slot."""
        length = self.lens[src] if length is None else length
        n_blocks = -(-length // self.block_size)
        # Share full blocks; a partially filled last block is copied (copy-on-write).
        table = self.blocks[src][: length // self.block_size]
        if len(table) < n_blocks:
            self.caches.copy_block(self.blocks[src][len(table)], self.next_block)
            table = table + [self.next_block]
            self.next_block += 1
        self.blocks[dst] = list(table)
        self.lens[dst] = length
        self.caches.copy_slot(src if from_slot is None else from_slot, dst)


def assert_padding_is_inert(model: HybridForCausalLM, a: list[int], b: list[int]) -> None:
    """Pad tokens after a batch's last span, or after each span (a fresh prefill, then one over a cached
    prefix, each beside a decoding row) change no real logit, and leave the states and KV the next, unpadded
    steps read."""
    runs = []
    for pad in (0, 13, [5, 13]):
        h = PagedHarness(model)
        out = h.step({0: a[:9]})
        out += h.step({0: a[9:10], 1: b[:11]}, pad=pad)
        out += h.step({1: b[11:12], 0: a[10:17]}, pad=pad)
        out += h.step({0: a[17:18], 1: b[12:18]})
        runs.append(torch.cat(out))
    assert rel_err(runs[1], runs[0]) < 1e-6 and rel_err(runs[2], runs[0]) < 1e-6
    assert rel_err(runs[0][1:], runs[0][:-1]) > 0.1  # not trivially equal


def rel_err(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))
