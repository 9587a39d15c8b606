"""ModelRunner: builds the forward metadata for a scheduled batch, runs the model, samples."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from flashstate.cache.cache_tensors import CacheTensors
from flashstate.device import upload
from flashstate.engine.scheduler import ScheduledBatch
from flashstate.engine.step_shapes import MAX_CHUNKS, decode_shaped
from flashstate.engine.worker.cuda_graph import DecodeGraphs
from flashstate.engine.worker.decode_inputs import DecodeInputs
from flashstate.engine.worker.mixed_graphs import MixedGraphs
from flashstate.layers.logits_adjust import AdjustRow, LogitsAdjust
from flashstate.layers.metadata import ForwardMetadata
from flashstate.layers.sampler import Sampler, SamplingBatch
from flashstate.models.base import HybridForCausalLM
from flashstate.sequence import Sequence

logger = logging.getLogger(__name__)
# The sampling rows' sequences -> their host token bitmask [n, W] int32, or None (engine/structured/).
TokenBitmaskFn = Callable[[list[Sequence]], torch.Tensor | None]


@dataclass(slots=True)
class InFlight:
    """A decode step launched on the device whose sampled tokens are not read yet."""

    seqs: list[Sequence]
    sampled: torch.Tensor  # [n] int64 on the device: feeds a step launched ahead
    tokens: torch.Tensor  # [n] int64 host (pinned on CUDA), valid once `done` has passed
    logprobs: torch.Tensor | None  # [n] fp32 host; None when no sequence asked
    done: torch.cuda.Event | None
    start: float
    # [n, K] on the device: the K most likely tokens per row and their logprobs; None when no row asked
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None
    graphed: bool = False  # replayed a captured decode graph


@dataclass(slots=True)
class StepOutput:
    token_ids: list[int | None]  # sampled token per sequence; None where its chunk did not reach the end
    logprobs: list[float | None]
    seconds: float
    # per sequence: the (token id, logprob) pairs of the params.logprobs most likely tokens, best first;
    # None where the sequence asked for none or sampled nothing
    top: list[list[tuple[int, float]] | None] | None = None


class DecodePeers(Protocol):
    """The other tensor-parallel ranks, kept in step with rank 0's decode batches (distributed/driver.py)."""

    local: HybridForCausalLM  # rank 0's share of the model: decode forwards and graphs run it

    def setup_decode(self, inputs: DecodeInputs, capture: bool) -> None:
        """Before rank 0 captures (or, with capture False, keeps eager) decode graphs over `inputs`."""

    def decode(self, inputs: DecodeInputs, rows: int, graphed: bool, tables_changed: bool) -> None:
        """Before rank 0 runs a decode batch from `inputs` (its first `rows` rows, replayed or eager)."""


class ModelRunner:
    def __init__(
        self,
        model: HybridForCausalLM,
        caches: CacheTensors,
        block_size: int,
        device: torch.device,
        peers: DecodePeers | None = None,
        vocab_limit: int | None = None,
    ):
        self.model = model
        self.peers = peers
        self._decode_model = peers.local if peers is not None else model
        self.caches = caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler(vocab_limit)  # ids from vocab_limit on have no token: never sampled
        self.eos_token_ids: tuple[int, ...] = ()  # what min_tokens masks, with each request's stop ids
        self.graphs: DecodeGraphs | None = None
        self.inputs: DecodeInputs | None = None  # pure-decode batches' persistent inputs
        self.mixed: MixedGraphs | None = None  # small mixed steps at fixed shapes
        self.graphed = False  # whether the batch launched last replayed a captured graph (the step trace's)
        # The last batch's SamplingBatch, kept while the batch is the same sequences (kept alive: ids unique).
        self._sampling: tuple[list[Sequence], list[int], SamplingBatch] | None = None
        # Two pinned (tokens, logprobs) pairs, alternating: a step launched ahead writes one while the
        # host reads the other.
        self._read_buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._read_turn = 0
        self._stops: tuple[list[Sequence], list[int], torch.Tensor | None] | None = None
        # Called with (request ids, logits [B, V]) of every sampling step; tests compare logits with it.
        self.on_logits: Callable[[list[str], torch.Tensor], None] | None = None
        caches.bind(model)

    def forget_batches(self) -> None:
        """After a failed step: wait for the device (raising if it faulted) and drop what was kept from
        earlier batches, so the next one is prepared from scratch."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._sampling = None
        self._stops = None
        if self.inputs is not None:
            self.inputs.forget()

    def capture_graphs(self, max_batch: int, max_blocks_per_seq: int) -> bool:
        """Keep persistent inputs for decode batches of up to max_batch sequences and, on CUDA, capture decode
        graphs that read them; False, staying eager, when the model cannot be captured."""
        self.inputs = DecodeInputs(
            max_batch,
            max_blocks_per_seq,
            self.block_size,
            self.caches.pad_block,
            self.caches.pad_slot,
            self.device,
        )
        capture = self.device.type == "cuda" and self.model.spec.cuda_graph_safe
        if self.peers is not None:
            self.peers.setup_decode(self.inputs, capture)
        if not capture:
            return False
        graphs = DecodeGraphs(self._decode_model, self.inputs)
        start = time.perf_counter()
        try:
            graphs.capture()
        except RuntimeError as e:  # an op that waits on the device (e.g. the reference ops' host loops)
            if self.peers is not None:  # the workers' captures cannot be left half-way
                raise
            logger.warning("decode stays eager: CUDA graph capture failed (%s)", _root_cause(e))
            torch.cuda.synchronize(self.device)
            return False
        self.graphs = graphs
        logger.info(
            "captured decode CUDA graphs for batch sizes %s in %.1f s",
            graphs.sizes,
            time.perf_counter() - start,
        )
        return True

    def capture_mixed_graphs(self, max_decode: int, max_blocks_per_seq: int) -> bool:
        """Run mixed steps with a few short prefill chunks padded to fixed shapes (mixed_graphs.py), captured
        as CUDA graphs on CUDA (eager, padded, elsewhere); False, leaving them eager and unpadded, when the
        model cannot be captured."""
        mixed = MixedGraphs(
            self.model, self.caches, self.block_size, max_blocks_per_seq, self.device, max_decode
        )
        if self.device.type == "cuda":
            if self.peers is not None or not self.model.spec.cuda_graph_safe:
                return False
            start = time.perf_counter()
            try:
                mixed.capture()
            except RuntimeError as e:
                logger.warning("mixed steps stay eager: graph capture failed (%s)", _root_cause(e))
                mixed.release()
                torch.cuda.synchronize(self.device)
                return False
            logger.info(
                "captured %d mixed-step CUDA graphs (%d decode x %d prefill sizes, <= %d chunks) in %.1f s",
                len(mixed.keys()), len(mixed.decode_sizes), len(mixed.prefill_sizes), MAX_CHUNKS,
                time.perf_counter() - start,
            )  # fmt: skip
        self.mixed = mixed
        return True

    def release_graphs(self) -> None:
        """Free the decode and mixed-step graphs; every step runs eager from here on."""
        graphs, self.graphs = self.graphs, None
        if graphs is not None:
            graphs.release()
        mixed, self.mixed = self.mixed, None
        if mixed is not None:
            mixed.release()

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
        return upload(tokens, torch.long, self.device), meta

    def is_decode(self, batch: ScheduledBatch) -> bool:
        """One token per sequence, each sampling, nothing exported: the persistent inputs can run it."""
        return self.inputs is not None and len(batch) <= self.inputs.max_batch and decode_shaped(batch)

    def _decode(self, seqs: list[Sequence]) -> torch.Tensor:
        n = len(seqs)
        graphs = self.graphs if self.graphs is not None and self.graphs.fits(n) else None
        bs = graphs.padded(n) if graphs is not None else n
        self.inputs.prepare(seqs, bs)
        return self._forward_decode(n, bs, graphs, self.inputs.upload(bs))

    def _forward_decode(
        self, n: int, bs: int, graphs: DecodeGraphs | None, tables_changed: bool
    ) -> torch.Tensor:
        """Logits [n, V] of the decode batch in `inputs` (uploaded), replayed when `graphs` is given."""
        if self.peers is not None:
            self.peers.decode(self.inputs, bs, graphs is not None, tables_changed)
        self.graphed = graphs is not None
        if graphs is not None:
            return graphs.replay(n)
        hidden = self._decode_model(self.inputs.input_ids(n), self.inputs.metadata(n))
        return self._decode_model.compute_logits(hidden).float()

    def _sampling_batch(self, seqs: list[Sequence]) -> SamplingBatch:
        ids = list(map(id, seqs))
        if self._sampling is None or self._sampling[1] != ids:
            batch = SamplingBatch.build([(s.params, s.generator) for s in seqs], device=self.device)
            self._sampling = (list(seqs), ids, batch)
        return self._sampling[2]

    def _adjust(self, seqs: list[Sequence], vocab: int) -> LogitsAdjust | None:
        """The step's penalties, bias and masks; None (no work) when no sequence has any."""
        if not any(s.params.adjusts_logits for s in seqs):
            return None
        rows = []
        for i, s in enumerate(seqs):
            p = s.params
            if p.adjusts_logits:
                stops = (*(() if p.ignore_eos else self.eos_token_ids), *p.stop_token_ids)
                rows.append(AdjustRow(i, p, s.prompt_token_ids, s.output_token_ids, stops))
        return LogitsAdjust.build(rows, vocab, self.device)

    def _launch_sampling(
        self,
        seqs: list[Sequence],
        logits: torch.Tensor,
        start: float,
        token_bitmask: TokenBitmaskFn | None = None,
    ) -> InFlight:
        # the forward is queued on the device: the host fills the grammar masks meanwhile
        mask = token_bitmask(seqs) if token_bitmask is not None else None
        if mask is not None:
            mask = mask.to(self.device, non_blocking=True)
        sampled = self.sampler(
            logits, self._sampling_batch(seqs), self._adjust(seqs, logits.shape[-1]), token_bitmask=mask
        )
        want = any(s.params.logprobs is not None for s in seqs)
        top = (sampled.top_token_ids, sampled.top_logprobs)
        if self.device.type != "cuda":
            return InFlight(
                seqs,
                sampled.token_ids,
                sampled.token_ids,
                sampled.logprobs if want else None,
                None,
                start,
                *top,
                self.graphed,
            )
        n = len(seqs)
        if not self._read_buffers or self._read_buffers[0][0].shape[0] < n:
            size = max(n, 64)
            self._read_buffers = [
                (
                    torch.empty(size, dtype=torch.int64, pin_memory=True),
                    torch.empty(size, dtype=torch.float32, pin_memory=True),
                )
                for _ in range(2)
            ]
        tokens, lps = (b[:n] for b in self._read_buffers[self._read_turn])
        self._read_turn ^= 1
        tokens.copy_(sampled.token_ids, non_blocking=True)
        if want:
            lps.copy_(sampled.logprobs, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        lps = lps if want else None
        return InFlight(seqs, sampled.token_ids, tokens, lps, done, start, *top, self.graphed)

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, token_bitmask: TokenBitmaskFn | None = None) -> InFlight:
        """Start a decode batch (`is_decode`) on the device; `collect` reads its tokens."""
        start = time.perf_counter()
        return self._launch_sampling(batch.seqs, self._decode(batch.seqs), start, token_bitmask)

    @torch.inference_mode()
    def launch_ahead(self, seqs: list[Sequence], prev: InFlight, stop_ids: list[frozenset[int]]) -> InFlight:
        """Start the decode step after `prev` for `seqs` (a subsequence of prev.seqs) before prev's tokens are
        read: each input is prev's sampled token, on the device. A row whose token is one of its
        `stop_ids` ends there: it runs into the pad block and slot, and its token is to be discarded."""
        start = time.perf_counter()
        n = len(seqs)
        graphs = self.graphs if self.graphs is not None and self.graphs.fits(n) else None
        bs = graphs.padded(n) if graphs is not None else n
        self.inputs.prepare(seqs, bs, ahead=True)
        tables_changed = self.inputs.upload(bs)
        rows = {id(s): i for i, s in enumerate(prev.seqs)}
        src = [rows[id(s)] for s in seqs]
        if src == list(range(n)):
            tokens = prev.sampled[:n]
        else:
            tokens = prev.sampled[upload(src, torch.long, self.device)]
        self.inputs.feed(tokens, self._stop_table(seqs, stop_ids))
        return self._launch_sampling(seqs, self._forward_decode(n, bs, graphs, tables_changed), start)

    def _stop_table(self, seqs: list[Sequence], stop_ids: list[frozenset[int]]) -> torch.Tensor | None:
        """[n, K] stop ids per row, -1 padded (None when no row has any), kept while the rows are the same."""
        ids = list(map(id, seqs))
        if self._stops is None or self._stops[1] != ids:
            width = max(map(len, stop_ids), default=0)
            table = None
            if width:
                rows = [sorted(s) + [-1] * (width - len(s)) for s in stop_ids]
                table = upload(rows, torch.int64, self.device)
            self._stops = (list(seqs), ids, table)
        return self._stops[2]

    def collect(self, flight: InFlight) -> StepOutput:
        """Wait for a launched step and read its tokens (and logprobs when asked)."""
        if flight.done is not None:
            flight.done.synchronize()
        tokens = flight.tokens.tolist()
        lps = flight.logprobs.tolist() if flight.logprobs is not None else [None] * len(tokens)
        top = None
        if flight.top_ids is not None:
            ids, values = flight.top_ids.tolist(), flight.top_logprobs.tolist()
            top = [
                None
                if s.params.logprobs is None
                else list(zip(i[: s.params.logprobs], v[: s.params.logprobs], strict=True))
                for s, i, v in zip(flight.seqs, ids, values, strict=True)
            ]
        return StepOutput(tokens, lps, time.perf_counter() - flight.start, top)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, token_bitmask: TokenBitmaskFn | None = None) -> StepOutput:
        """Run a batch and sample its sampling rows. `token_bitmask(seqs)`: the host bitmask of those rows
        (constrained decoding; None where no row is constrained)."""
        start = time.perf_counter()
        n = len(batch)
        if self.is_decode(batch) and self.on_logits is None:
            return self.collect(self.launch(batch, token_bitmask))
        rows = [i for i in range(n) if batch.samples(i)]  # a decode batch: every row
        if self.is_decode(batch):
            logits = self._decode(batch.seqs)
        elif self.mixed is not None and (key := self.mixed.bucket(batch)) is not None:
            logits = self.mixed.forward(batch, key, rows)
            self.graphed = self.mixed.captured(key)
        else:
            self.graphed = False
            input_ids, meta = self.build_metadata(batch)
            hidden = self.model(input_ids, meta)
            if rows:
                last = meta.cu_seqlens[1:][upload(rows, torch.long, self.device)] - 1
                logits = self.model.compute_logits(hidden[last]).float()
        token_ids: list[int | None] = [None] * n
        logprobs: list[float | None] = [None] * n
        top: list[list[tuple[int, float]] | None] | None = None
        if rows:
            seqs = [batch.seqs[i] for i in rows]
            if self.on_logits is not None:
                self.on_logits([s.request_id for s in seqs], logits)
            out = self.collect(self._launch_sampling(seqs, logits, start, token_bitmask))
            for j, i in enumerate(rows):
                token_ids[i], logprobs[i] = out.token_ids[j], out.logprobs[j]
            if out.top is not None:
                top = [None] * n
                for j, i in enumerate(rows):
                    top[i] = out.top[j]
        elif self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepOutput(token_ids, logprobs, time.perf_counter() - start, top)


def _root_cause(error: BaseException) -> str:
    """The first line of the earliest error in `error`'s chain: a failed capture raises "operation failed
    due to a previous error during capture" when the graph context closes, hiding the op that failed."""
    while error.__context__ is not None:
        error = error.__context__
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"
