"""MixedGraphs: mixed steps (decode rows plus a few short prefill chunks) at fixed shapes, as CUDA graphs.

A small mixed step is host-bound when run eagerly (~45 ms to issue a 24-layer forward on the H200 for ~15 ms
of GPU work, docs/history/benchmarks-2026-11.md). Here it runs padded to a bucket (B, K, T): B decode-shaped
rows (the batch's one-token rows, then pad rows into the pad block and pad slot), then its K prefill chunks,
each padded to a multiple of FLA_CHUNK tokens and the last one to make T in all
(`ForwardMetadata.build(pad=...)`: pad tokens are masked out of the recurrent updates and write their KV into
the pad block). The step's state exports (the checkpoints the cache keeps: prompt ends, block boundaries,
message ends) go to their rows, and pad exports make MAX_EXPORTS of them: the state after row 0's token
into the pad slot. For a bucket every shape is fixed — the token count, the chunk list's length, the export
count, the attention tiles, the spans — so its forward and the logits at each row's last real token are
captured once and replayed with new contents in the bucket's buffers. On the CPU the same padded forward runs
eagerly (what the tests check).

    graphs = MixedGraphs(model, caches, block_size, max_blocks, device, max_decode)
    graphs.capture()                       # CUDA
    key = graphs.bucket(batch)             # None: not a mixed step this can run
    logits = graphs.forward(batch, key, rows)  # [len(rows), V] fp32: the rows that sample
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from flashstate.cache.cache_tensors import CacheTensors
from flashstate.device import upload
from flashstate.engine.scheduler import ScheduledBatch
from flashstate.engine.step_shapes import PREFILL_SIZES, MixedBuckets, chunk_lens
from flashstate.layers.metadata import ForwardMetadata
from flashstate.models.base import HybridForCausalLM
from flashstate.ops.chunking import FLA_CHUNK
from flashstate.ops.fla_cache import fla_tensor_cache_off

# what changes from one step to the next in a bucket's metadata (with the block tables); the rest is its shape
_PER_STEP = (
    "cu_seqlens",
    "chunk_indices",
    "token_seqs",
    "positions",
    "context_lens",
    "slot_mapping",
    "state_slots",
    "has_initial_state",
    "real_tokens",
    "last_real",
    "export_token_ids",
    "export_slots",
)


@dataclass(slots=True)
class _Bucket:
    tokens: Tensor  # [B + T] int64
    meta: ForwardMetadata  # fixed-shape tensors the forward reads
    logits: Tensor | None = None  # [B + K, V] fp32, the captured output
    graph: torch.cuda.CUDAGraph | None = None


class MixedGraphs(MixedBuckets):
    def __init__(
        self,
        model: HybridForCausalLM,
        caches: CacheTensors,
        block_size: int,
        max_blocks_per_seq: int,
        device: torch.device,
        max_decode: int,
        prefill_sizes: tuple[int, ...] = PREFILL_SIZES,
    ):
        super().__init__(block_size, max_blocks_per_seq, max_decode, prefill_sizes)
        self.model = model
        self.caches = caches
        self.device = device
        self._buckets: dict[tuple[int, int, int], _Bucket] = {}
        self._pool = None

    def forward(self, batch: ScheduledBatch, key: tuple[int, int, int], rows: list[int]) -> Tensor:
        """Logits [len(rows), V] (fp32) at the last token of each batch row in `rows`."""
        b, k, t = key
        entry = self._entry(key)
        chunks = [i for i, n in enumerate(batch.num_tokens) if n > 1]
        order = [i for i, n in enumerate(batch.num_tokens) if n == 1] + chunks
        ones = len(order) - k  # the chunks' rows sit after the B one-token rows
        at = {i: j if j < ones else b + j - ones for j, i in enumerate(order)}  # batch index → padded row
        tokens, meta = self._padded(batch, order, at, b, k, t)
        entry.tokens.copy_(tokens)
        for f in _PER_STEP:
            getattr(entry.meta, f).copy_(getattr(meta, f))
        entry.meta.block_tables.fill_(self.caches.pad_block)
        entry.meta.block_tables[:, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        if entry.graph is not None:
            entry.graph.replay()
            logits = entry.logits
        else:
            logits = self._logits(entry)
        return logits[upload([at[i] for i in rows], torch.long, self.device)]

    def captured(self, key: tuple[int, int, int]) -> bool:
        entry = self._buckets.get(key)
        return entry is not None and entry.graph is not None

    def _padded(
        self, batch: ScheduledBatch, order: list[int], at: dict[int, int], b: int, k: int, t: int
    ) -> tuple[Tensor, ForwardMetadata]:
        """The batch's one-token rows, pad rows up to B (token 0 at position 0 into the pad block and slot),
        then its K chunks padded (`chunk_lens`): input ids and metadata. Its exports go to their rows (`at`:
        batch index → padded row), then pad exports up to max_exports."""
        pad_block, fill, ones = self.caches.pad_block, b - (len(order) - k), len(order) - k
        seqs = [batch.seqs[i] for i in order]
        counts = [batch.num_tokens[i] for i in order]
        pads = [0] * b + [n - c for n, c in zip(chunk_lens(counts[ones:], t), counts[ones:], strict=True)]

        def rows(values: list, pad_row: object) -> list:
            return [*values[:ones], *[pad_row] * fill, *values[ones:]]

        done = [s.num_computed_tokens for s in seqs]
        spans = [s.token_ids[d : d + n] for s, d, n in zip(seqs, done, counts, strict=True)]
        exports = [(at[i], n, slot) for i, n, slot in batch.exports]
        meta = ForwardMetadata.build(
            rows(counts, 1), rows([d + n for d, n in zip(done, counts, strict=True)], 1),
            rows([s.block_table for s in seqs], [pad_block]), self.block_size,
            rows([s.state_slot for s in seqs], self.caches.pad_slot), rows([d > 0 for d in done], False),
            device=self.device, pad=pads, pad_block=pad_block,
            exports=exports + self._pad_exports(self.max_exports - len(exports)),
        )  # fmt: skip
        ids = [tok for span, p in zip(rows(spans, [0]), pads, strict=True) for tok in (*span, *[0] * p)]
        return upload(ids, torch.long, self.device), meta

    def _pad_exports(self, n: int) -> list[tuple[int, int, int]]:
        """n exports that change nothing: the state after row 0's token (a decode row or a pad row, every
        bucket has one) into the pad slot."""
        return [(0, 1, self.caches.pad_slot)] * n

    def _entry(self, key: tuple[int, int, int]) -> _Bucket:
        entry = self._buckets.get(key)
        if entry is None:
            entry = self._buckets[key] = self._new_bucket(*key)
        return entry

    def _new_bucket(self, b: int, k: int, t: int) -> _Bucket:
        """Buffers for (B, K, T), holding a batch of pad rows and all-pad chunks (a valid forward)."""
        pad_block = self.caches.pad_block
        lens = [1] * b + chunk_lens([FLA_CHUNK] * k, t)
        tables = [[pad_block] * -(-n // self.block_size) for n in lens]
        slots = [self.caches.pad_slot] * (b + k)
        meta = ForwardMetadata.build(
            lens, lens, tables, self.block_size, slots, [False] * (b + k), device=self.device,
            exports=self._pad_exports(self.max_exports),
        )  # fmt: skip
        real = torch.ones(b + t, dtype=torch.bool, device=self.device)
        table = torch.full((b + k, self.width), pad_block, dtype=torch.int64, device=self.device)
        table[:, : meta.block_tables.shape[1]] = meta.block_tables
        values = {f.name: getattr(meta, f.name) for f in fields(ForwardMetadata)}
        values |= {"block_tables": table, "real_tokens": real, "last_real": meta.cu_seqlens[1:] - 1}
        values["spans"] = (1, False)  # decode rows and chunks over a prefix: the paged kernel, always
        values = {name: v.clone() if isinstance(v, Tensor) else v for name, v in values.items()}
        return _Bucket(torch.zeros(b + t, dtype=torch.long, device=self.device), ForwardMetadata(**values))

    def _logits(self, entry: _Bucket) -> Tensor:
        hidden = self.model(entry.tokens, entry.meta)
        return self.model.compute_logits(hidden[entry.meta.last_real]).float()

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket (most tokens first: later graphs fit in its memory pool)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), fla_tensor_cache_off():
            for key in sorted(self.keys(), key=lambda bkt: (bkt[0] + bkt[2], bkt[1]), reverse=True):
                entry = self._entry(key)
                for _ in range(2):  # warm-up: autotuning and lazy initialisation happen outside capture
                    self._logits(entry)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                    entry.logits = self._logits(entry)
                if self._pool is None:
                    self._pool = graph.pool()
                entry.graph = graph
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def release(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for entry in self._buckets.values():
            if entry.graph is not None:
                entry.graph.reset()
        self._buckets.clear()
        self._pool = None
