"""ModelRunner: builds the forward metadata for a scheduled batch, runs the model, samples."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from flashstate.engine.cache_tensors import CacheTensors
from flashstate.engine.cuda_graph import DecodeGraphs
from flashstate.engine.scheduler import ScheduledBatch
from flashstate.engine.sequence import Sequence
from flashstate.layers.metadata import ForwardMetadata
from flashstate.layers.sampler import Sampler, SamplingBatch
from flashstate.models.base import HybridForCausalLM

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StepOutput:
    token_ids: list[int | None]  # sampled token per sequence; None where its chunk did not reach the end
    logprobs: list[float | None]
    seconds: float


class ModelRunner:
    def __init__(self, model: HybridForCausalLM, caches: CacheTensors, block_size: int, device: torch.device):
        self.model = model
        self.caches = caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.graphs: DecodeGraphs | None = None
        # request id -> (the block-table list it mirrors, its rows as an array, rows filled)
        self._tables: dict[str, tuple[list[int], np.ndarray, int]] = {}
        # Called with (request ids, logits [B, V]) of every sampling step; tests compare logits with it.
        self.on_logits: Callable[[list[str], torch.Tensor], None] | None = None
        caches.bind(model)

    def capture_graphs(self, max_batch: int, max_blocks_per_seq: int) -> bool:
        """Capture decode graphs (CUDA only); False, staying eager, when the model cannot be captured."""
        if self.device.type != "cuda" or not self.model.spec.cuda_graph_safe:
            return False
        graphs = DecodeGraphs(
            self.model,
            self.block_size,
            max_batch,
            max_blocks_per_seq,
            self.caches.pad_block,
            self.caches.pad_slot,
            self.device,
        )
        start = time.perf_counter()
        try:
            graphs.capture()
        except RuntimeError as e:  # an op that waits on the device (e.g. the reference ops' host loops)
            logger.warning("decode stays eager: CUDA graph capture failed (%s)", str(e).splitlines()[0])
            torch.cuda.synchronize(self.device)
            return False
        self.graphs = graphs
        logger.info(
            "captured decode CUDA graphs for batch sizes %s in %.1f s",
            graphs.sizes,
            time.perf_counter() - start,
        )
        return True

    def build_metadata(self, batch: ScheduledBatch) -> tuple[torch.Tensor, ForwardMetadata]:
        tokens: list[int] = []
        for seq, n in zip(batch.seqs, batch.num_tokens, strict=True):
            tokens.extend(seq.token_ids[seq.num_computed_tokens : seq.num_computed_tokens + n])
        meta = ForwardMetadata.build(
            query_lens=batch.num_tokens,
            context_lens=[
                s.num_computed_tokens + n for s, n in zip(batch.seqs, batch.num_tokens, strict=True)
            ],
            block_tables=[s.block_table for s in batch.seqs],
            block_size=self.block_size,
            state_slots=[s.state_slot for s in batch.seqs],
            has_initial_state=[s.num_computed_tokens > 0 for s in batch.seqs],
            exports=batch.exports,
            device=self.device,
        )
        return torch.tensor(tokens, dtype=torch.long, device=self.device), meta

    def _table(self, seq: Sequence) -> np.ndarray:
        """seq.block_table as an array, extended in place as the list grows (decode adds a block every
        block_size steps; rebuilding the whole table per step would cost more than the step)."""
        table = seq.block_table
        entry = self._tables.get(seq.request_id)
        if entry is not None:
            source, arr, filled = entry
            if source is table and filled <= len(table) <= len(arr):
                if len(table) > filled:
                    arr[filled : len(table)] = table[filled:]
                self._tables[seq.request_id] = (table, arr, len(table))
                return arr[: len(table)]
        arr = np.zeros(max(2 * len(table), 16), dtype=np.int64)
        arr[: len(table)] = table
        self._tables[seq.request_id] = (table, arr, len(table))
        return arr[: len(table)]

    def _graph_decode(self, batch: ScheduledBatch) -> torch.Tensor:
        seqs = batch.seqs
        tables = [self._table(s) for s in seqs]
        if len(self._tables) > 4 * max(len(seqs), 16):
            live = {s.request_id for s in seqs}
            self._tables = {k: v for k, v in self._tables.items() if k in live}
        return self.graphs.run(
            [s.token_ids[s.num_computed_tokens] for s in seqs],
            [s.num_computed_tokens for s in seqs],
            tables,
            [s.state_slot for s in seqs],
            [s.num_computed_tokens > 0 for s in seqs],
        )

    def _uses_graph(self, batch: ScheduledBatch) -> bool:
        return (
            self.graphs is not None
            and not batch.exports
            and self.graphs.fits(len(batch))
            and all(n == 1 for n in batch.num_tokens)
            and all(batch.samples(i) for i in range(len(batch)))
        )

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepOutput:
        start = time.perf_counter()
        if self._uses_graph(batch):
            rows = list(range(len(batch)))
            logits = self._graph_decode(batch)
        else:
            input_ids, meta = self.build_metadata(batch)
            hidden = self.model(input_ids, meta)
            rows = [i for i in range(len(batch)) if batch.samples(i)]
            if rows:
                last = meta.cu_seqlens[1:][torch.tensor(rows, device=self.device)] - 1
                logits = self.model.compute_logits(hidden[last]).float()
        token_ids: list[int | None] = [None] * len(batch)
        logprobs: list[float | None] = [None] * len(batch)
        if rows:
            seqs = [batch.seqs[i] for i in rows]
            if self.on_logits is not None:
                self.on_logits([s.request_id for s in seqs], logits)
            sampling = SamplingBatch.build([(s.params, s.generator) for s in seqs], device=self.device)
            sampled = self.sampler(logits, sampling)
            for i, t, lp in zip(rows, sampled.token_ids.tolist(), sampled.logprobs.tolist(), strict=True):
                token_ids[i], logprobs[i] = t, lp
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepOutput(token_ids, logprobs, time.perf_counter() - start)
