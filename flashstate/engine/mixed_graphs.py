"""MixedGraphs: mixed steps (decode rows plus one short prefill chunk) at fixed shapes, as CUDA graphs.

A small mixed step is host-bound when run eagerly (~45 ms to issue a 24-layer forward on the H200 for ~15 ms
of GPU work, benchmarks/BENCHMARKS.md). Here it runs padded to a bucket (B, T): B decode-shaped rows (the
batch's one-token rows, then pad rows into the pad block and pad slot) and the prefill chunk last, padded to
T tokens (`ForwardMetadata.build(pad=...)`: pad tokens are masked out of the recurrent updates and write
their KV into the pad block). For a bucket every shape is fixed — the chunk list, the attention tiles, the
spans — so its forward and the logits at each row's last real token are captured once and replayed with
new contents in the bucket's buffers. On the CPU the same padded forward runs eagerly (what the tests check).

    graphs = MixedGraphs(model, caches, block_size, max_blocks, device, max_decode)
    graphs.capture()                       # CUDA
    key = graphs.bucket(batch)             # None: not a mixed step this can run
    logits = graphs.forward(batch, key, rows)  # [len(rows), V] fp32: the rows that sample
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from flashstate.device import upload
from flashstate.engine.cache_tensors import CacheTensors
from flashstate.engine.cuda_graph import capture_sizes
from flashstate.engine.scheduler import ScheduledBatch
from flashstate.layers.metadata import FLA_CHUNK, ForwardMetadata
from flashstate.models.base import HybridForCausalLM
from flashstate.ops.fla_cache import fla_tensor_cache_off

PREFILL_SIZES = (64, 128, 256, 512)  # multiples of FLA_CHUNK: a bucket's chunk list is fixed
# what changes from one step to the next in a bucket's metadata (with the block tables); the rest is its shape
_PER_STEP = (
    "positions",
    "context_lens",
    "slot_mapping",
    "state_slots",
    "has_initial_state",
    "real_tokens",
    "last_real",
)


@dataclass(slots=True)
class _Bucket:
    tokens: Tensor  # [B + T] int64
    meta: ForwardMetadata  # fixed-shape tensors the forward reads
    logits: Tensor | None = None  # [B + 1, V] fp32, the captured output
    graph: torch.cuda.CUDAGraph | None = None


class MixedBuckets:
    """The (B, T) shapes mixed steps are padded to, and the one a batch takes (shapes alone: the simulator
    asks it too)."""

    def __init__(
        self,
        block_size: int,
        max_blocks_per_seq: int,
        max_decode: int,
        prefill_sizes: tuple[int, ...] = PREFILL_SIZES,
    ):
        if any(t % FLA_CHUNK for t in prefill_sizes):
            raise ValueError(f"prefill sizes must be multiples of {FLA_CHUNK}, got {prefill_sizes}")
        self.block_size = block_size
        self.width = max_blocks_per_seq
        self.decode_sizes = capture_sizes(max_decode)
        self.prefill_sizes = sorted(prefill_sizes)

    def bucket(self, batch: ScheduledBatch) -> tuple[int, int] | None:
        """(B, T) of a batch with no exports, exactly one row of more than one token (at most the largest
        prefill size) and at most the largest decode size of one-token rows; None for any other."""
        long_rows = [i for i, n in enumerate(batch.num_tokens) if n > 1]
        if batch.exports or len(long_rows) != 1:
            return None
        seq, n, rows = batch.seqs[long_rows[0]], batch.num_tokens[long_rows[0]], len(batch) - 1
        t = next((s for s in self.prefill_sizes if s >= n), None)
        b = next((s for s in self.decode_sizes if s >= max(rows, 1)), None)
        if t is None or b is None or -(-(seq.num_computed_tokens + t) // self.block_size) > self.width:
            return None  # no bucket, or the pads would run past the widest block table
        return b, t


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
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._pool = None

    def forward(self, batch: ScheduledBatch, key: tuple[int, int], rows: list[int]) -> Tensor:
        """Logits [len(rows), V] (fp32) at the last token of each batch row in `rows`."""
        b, t = key
        entry = self._entry(b, t)
        p = next(i for i, n in enumerate(batch.num_tokens) if n > 1)
        order = [i for i in range(len(batch)) if i != p]
        tokens, meta = self._padded(batch, order, p, b, t)
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
        at = {i: j for j, i in enumerate(order)} | {p: b}  # the chunk's row sits after the B one-token rows
        return logits[upload([at[i] for i in rows], torch.long, self.device)]

    def _padded(
        self, batch: ScheduledBatch, order: list[int], p: int, b: int, t: int
    ) -> tuple[Tensor, ForwardMetadata]:
        """The batch's one-token rows, pad rows up to B (token 0 at position 0 into the pad block and slot),
        then the chunk padded to T tokens: input ids and metadata."""
        pad_block, fill = self.caches.pad_block, b - len(order)
        seqs = [batch.seqs[i] for i in (*order, p)]
        counts = [batch.num_tokens[i] for i in (*order, p)]

        def rows(values: list, pad_row: object) -> list:
            return [*values[:-1], *[pad_row] * fill, values[-1]]

        done = [s.num_computed_tokens for s in seqs]
        spans = [s.token_ids[d : d + n] for s, d, n in zip(seqs, done, counts, strict=True)]
        meta = ForwardMetadata.build(
            rows(counts, 1), rows([d + n for d, n in zip(done, counts, strict=True)], 1),
            rows([s.block_table for s in seqs], [pad_block]), self.block_size,
            rows([s.state_slot for s in seqs], self.caches.pad_slot), rows([d > 0 for d in done], False),
            device=self.device, pad=t - counts[-1], pad_block=pad_block,
        )  # fmt: skip
        ids = [tok for span in rows(spans, [0]) for tok in span]
        return upload([*ids, *[0] * (t - counts[-1])], torch.long, self.device), meta

    def _entry(self, b: int, t: int) -> _Bucket:
        entry = self._buckets.get((b, t))
        if entry is None:
            entry = self._buckets[(b, t)] = self._new_bucket(b, t)
        return entry

    def _new_bucket(self, b: int, t: int) -> _Bucket:
        """Buffers for (B, T), holding a batch of pad rows and an all-pad prefill row (a valid forward)."""
        pad_block, lens = self.caches.pad_block, [1] * b + [t]
        tables = [[pad_block]] * b + [[pad_block] * -(-t // self.block_size)]
        slots = [self.caches.pad_slot] * (b + 1)
        meta = ForwardMetadata.build(
            lens, lens, tables, self.block_size, slots, [False] * (b + 1), device=self.device
        )
        real = torch.ones(b + t, dtype=torch.bool, device=self.device)
        table = torch.full((b + 1, self.width), pad_block, dtype=torch.int64, device=self.device)
        table[:, : meta.block_tables.shape[1]] = meta.block_tables
        values = {f.name: getattr(meta, f.name) for f in fields(ForwardMetadata)}
        values |= {"block_tables": table, "real_tokens": real, "last_real": meta.cu_seqlens[1:] - 1}
        values["spans"] = (1, False)  # decode rows and a chunk over a prefix: the paged kernel, always
        values = {k: v.clone() if isinstance(v, Tensor) else v for k, v in values.items()}
        return _Bucket(torch.zeros(b + t, dtype=torch.long, device=self.device), ForwardMetadata(**values))

    def _logits(self, entry: _Bucket) -> Tensor:
        hidden = self.model(entry.tokens, entry.meta)
        return self.model.compute_logits(hidden[entry.meta.last_real]).float()

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket (largest first: later graphs fit in its memory pool)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), fla_tensor_cache_off():
            for b in reversed(self.decode_sizes):
                for t in reversed(self.prefill_sizes):
                    entry = self._entry(b, t)
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
