"""ModelRunner: builds the forward metadata for a scheduled batch, runs the model, samples."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashstate.engine.cache_tensors import CacheTensors
from flashstate.engine.scheduler import ScheduledBatch
from flashstate.layers.metadata import ForwardMetadata
from flashstate.layers.sampler import Sampler, SamplingBatch
from flashstate.models.base import HybridForCausalLM


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
        # Called with (request ids, logits [B, V]) of every sampling step; tests compare logits with it.
        self.on_logits: Callable[[list[str], torch.Tensor], None] | None = None
        caches.bind(model)

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

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepOutput:
        start = time.perf_counter()
        input_ids, meta = self.build_metadata(batch)
        hidden = self.model(input_ids, meta)
        rows = [i for i in range(len(batch)) if batch.samples(i)]
        token_ids: list[int | None] = [None] * len(batch)
        logprobs: list[float | None] = [None] * len(batch)
        if rows:
            last = meta.cu_seqlens[1:][torch.tensor(rows, device=self.device)] - 1
            logits = self.model.compute_logits(hidden[last]).float()
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
