"""LLMEngine: requests in, RequestOutputs out, one `step()` at a time.

batch = scheduler.schedule()
out = model_runner.run(batch)
scheduler.update_from_output(batch, out.token_ids, on_token)   # computed lengths, exports, tokens, retire

With async scheduling a pure decode step is launched before the previous step's tokens are read (see
`_pipeline`); text is detokenised when an output is read (TextStream), except for requests with stop
strings.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import time

import torch

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.cache_tensors import CacheTensors, kv_dtype
from flashstate.cache.cost import DEFAULT_COST, PrefillCost
from flashstate.cache.host import build_host_tier
from flashstate.cache.manager import CacheManager
from flashstate.cache.memory_plan import CachePlan, cache_budget, plan_cache, vllm_page_pool
from flashstate.cache.policy import build_policy
from flashstate.cache.state_pool import StatePool
from flashstate.config import EngineConfig
from flashstate.device import resolve_device
from flashstate.engine.calibration import load_or_calibrate, max_calibration_tokens
from flashstate.engine.output.request_output import RequestOutput
from flashstate.engine.output.stop_checker import Finish
from flashstate.engine.request_state import GRAMMAR_END, RequestState
from flashstate.engine.scheduler import ScheduledBatch, Scheduler
from flashstate.engine.stats_snapshot import snapshot
from flashstate.engine.step_trace import StepTrace
from flashstate.engine.structured import StructuredDecoding
from flashstate.engine.worker.model_runner import InFlight, ModelRunner, StepOutput
from flashstate.generation_config import generation_defaults
from flashstate.models.loader import load_model, load_tokenizer
from flashstate.ops.compile_watch import CompileWatch
from flashstate.ops.kernel_cache import open_archive
from flashstate.sampling_params import SamplingParams
from flashstate.sequence import Sequence, SequenceStatus
from flashstate.spec.model_spec import DTYPES
from flashstate.spec.preset_configs import DEFAULT_PRESET

logger = logging.getLogger("flashstate")
# A sequence in this many failed steps fails, even if it never failed alone (see LLMEngine.recover).
MAX_FAULTS = 3
# This many failed steps without one that succeeds between them: the engine, not a request, is broken.
MAX_FAILED_STEPS_IN_A_ROW = 4


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None):
        self.config = config = config or EngineConfig()
        self.device = resolve_device(config.device)
        model_dir = config.model
        if model_dir is None and config.load_format == "dummy":
            model_dir = DEFAULT_PRESET  # built on the device, nothing written
        elif model_dir is None:
            from flashstate.models.presets import default_model_dir

            model_dir = str(default_model_dir())
        dtype = None if config.dtype == "auto" else DTYPES[config.dtype]
        torch.manual_seed(config.seed)
        self.tp = None  # TensorParallelDriver with tensor_parallel_size > 1: this process is rank 0
        if config.tensor_parallel_size > 1:
            from flashstate.distributed.driver import TensorParallelDriver

            if config.load_format == "dummy":
                raise ValueError("--load-format dummy with --tensor-parallel-size > 1 is not supported")

            self.tp = TensorParallelDriver(config, str(model_dir), self.device)
            self.device = self.tp.device
        self._in_flight: tuple[ScheduledBatch, InFlight] | None = None  # a decode step launched ahead
        self._stepping: list[Sequence] = []  # the sequences of the step under way (see `recover`)
        self._graphed = False  # whether the step under way replayed a captured graph (the step trace)
        self._failed_steps = 0  # steps failed since the last that succeeded
        self.trace: StepTrace | None = None
        self._scheduled_at = 0.0
        try:
            self._build(config, model_dir, dtype)
        except BaseException:
            self.close()
            raise
        tp = config.tensor_parallel_size
        logger.info(
            "%s on %s (%s, KV cache %s, tensor parallel %d): %s", self.spec.architecture, self.device,
            self.dtype, kv_dtype(config.kv_cache_dtype, self.dtype), tp, self.plan.describe(),
        )  # fmt: skip

    def _build(self, config: EngineConfig, model_dir: str, dtype: torch.dtype | None) -> None:
        # before anything compiles (the graph captures and the warm-up): an earlier start's kernels
        self.kernels = open_archive(config.kernel_cache, self.device)
        if self.kernels is not None:
            self.kernels.restore()
        shard = self.tp.shard if self.tp is not None else None
        self.model = load_model(
            model_dir, dtype=dtype, device=self.device, shard=shard, load_format=config.load_format,
            seed=config.seed, quantization=config.quantization,
        )  # fmt: skip
        if self.tp is not None:
            self.tp.group.attach(self.model)
        self.spec = self.model.spec
        self.dtype = next(self.model.parameters()).dtype
        self.tokenizer = load_tokenizer(model_dir, config.tokenizer, config.load_format)
        self.eos_token_ids = tuple(self.tokenizer.eos_token_ids) or self.spec.eos_token_ids
        # request-field defaults (--generation-config) the server applies to requests that leave them unset
        self.generation_defaults = generation_defaults(config.generation_config, model_dir)
        self.structured = StructuredDecoding(
            self.tokenizer, self.spec.vocab_size, self.eos_token_ids, pin=self.device.type == "cuda"
        )
        self.max_model_len = config.max_model_len or self.spec.max_position_embeddings
        fit = config.kv_cache_memory_bytes is None and self.device.type == "cuda"  # the budget is free memory
        self.plan: CachePlan = plan_cache(self.spec, config, self.dtype, self._cache_budget(), fit)
        caches = CacheTensors.allocate(
            self.spec, self.plan.num_blocks, config.block_size, self.plan.num_slots, self.dtype, self.device,
            kv_dtype(config.kv_cache_dtype, self.dtype),
        )  # fmt: skip
        if self.tp is not None:
            caches = self.tp.start(self.model, caches, self.plan.num_blocks, self.plan.num_slots)
            self.model = self.tp.model
        self.cost = self._prefill_cost(caches)
        self.runner = ModelRunner(
            self.model,
            caches,
            config.block_size,
            self.device,
            peers=self.tp,
            vocab_limit=self.tokenizer.id_limit,
        )
        self.runner.eos_token_ids = tuple(self.eos_token_ids)
        if not config.enforce_eager:
            self.runner.capture_graphs(config.max_num_seqs, -(-self.max_model_len // config.block_size))
        if config.graphs_mixed_steps(self.device.type == "cuda"):
            self.runner.capture_mixed_graphs(config.max_num_seqs, -(-self.max_model_len // config.block_size))
        self.requests: dict[str, RequestState] = {}
        # Branches of an n > 1 request waiting for the first branch to prefill the shared prompt (see
        # `add`): the first branch's id -> the others.
        self._forks: dict[str, list[RequestState]] = {}
        self._ids = itertools.count()
        self.host = None
        self.compiles = CompileWatch()  # kernels the warm-up missed, from its end on
        if self.device.type == "cuda":
            self._new_cache()
            self.warm_up()
            self.compiles.install()
            if self.kernels is not None:
                self.kernels.save()
        self.host = build_host_tier(config, self.model, caches, self.cost)
        self._new_cache()
        if config.step_trace is not None:
            self.trace = StepTrace(config.step_trace)
        if self.host is not None:
            logger.info(
                "host tier: %s store, %.1f MiB, %d-token chunks",
                self.host.store.name,
                self.host.capacity / (1 << 20),
                self.host.layout.chunk_tokens,
            )

    def warm_up(self) -> None:
        """The GPU start-up warm-up: every serving path's kernels built before the first request.

        A fresh prefill, a prefill over a cached prefix exporting a state, mixed and decode steps, at every
        power-of-two step size up to the token budget: some kernels are tuned per size class (the short
        conv), and a class first met while serving would stall that step for seconds. The caller then starts
        a fresh cache, so nothing of this is served or counted."""
        # the longest warm-up request holds 1.5 × top tokens: within what the cache can ever hold
        top = min(self.config.max_num_batched_tokens, self.context_limit // 2)
        # largest first: a kernel tuned per size class is tuned at the longest batch of the class
        sizes = sorted({min(top, 1 << k) for k in range(1, top.bit_length() + 1)} - {1}, reverse=True)
        params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
        for n in sizes:
            first = [(7 * i + n) % (self.spec.vocab_size - 1) + 1 for i in range(n)]
            for ids, marks in ((first, [n // 2]), (first + first[: n // 2], [n + n // 4])):
                self.add_request(ids, params, checkpoint_positions=marks)
                self.add_request(first[: max(1, n // 3)], params)  # a second sequence: mixed steps
                while self.has_unfinished():
                    self.step()

    def _new_cache(self) -> None:
        """A fresh prefix cache (empty tree, free pools, zero counters) and scheduler over the runner's
        cache tensors."""
        c, caches = self.config, self.runner.caches
        if self._in_flight is not None:
            raise RuntimeError("a new prefix cache while a decode step is in flight")
        self.cache = CacheManager(
            BlockPool(self.plan.num_blocks, c.block_size),
            StatePool(self.plan.num_slots, caches.copy_slot),
            build_policy(c, self.spec, self.dtype, self.cost),
            max_checkpoints=self.plan.max_checkpoints,
            copy_block=caches.copy_block,
            host=self.host,
            pages=vllm_page_pool(self.plan, c, self.spec, self.dtype),
            byte_budget=self.plan.shared_bytes,
            working_charged=self.plan.working_charged,
        )
        self.scheduler = Scheduler.from_config(self.cache, c, self.max_model_len)
        self.stats = snapshot(self.scheduler, self.cache)  # replaced after every step

    def _prefill_cost(self, caches: CacheTensors) -> PrefillCost:
        """C(n) from the flag, else (when GDS needs it) the cached or a fresh calibration."""
        c = self.config
        if c.prefill_cost_coefficients is not None:
            return PrefillCost(*c.prefill_cost_coefficients, source="given")
        gds = c.cache_policy == "flashstate" and (c.prefix_cache_eviction or "gds") == "gds"
        if not (c.prefix_caching and gds):
            return DEFAULT_COST
        max_tokens = max_calibration_tokens(
            self.device, self.max_model_len, self.plan.num_blocks * c.block_size
        )
        return load_or_calibrate(
            self.model,
            caches,
            c.block_size,
            c.max_num_batched_tokens,
            max_tokens,
            self.device,
            c.calibration_cache_dir,
        )

    def _cache_budget(self) -> int:
        budget = cache_budget(self.config, self.device)
        return budget if self.tp is None else self.tp.agree_on_budget(budget)

    # ---- requests -------------------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        checkpoint_positions: list[int] | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        fork_of: str | None = None,
    ) -> str:
        """Tokenise and queue a request; raises ValueError (RequestTooLargeError) if it can never run.

        `checkpoint_positions`: prompt token counts where the prefix cache may keep a checkpoint (e.g. the
        ends of chat messages); used when the policy exports states from inside prefill. `cache_salt`: the
        request's prefix-cache hits (GPU and host tier) come only from requests with the same salt.
        `priority`: with the priority scheduling policy, lower runs first (vLLM's). `fork_of`: the id of
        another branch of the same n > 1 request (same prompt), queued first: this one waits until that one
        has prefilled the prompt, then starts from its checkpoint (see `add`)."""
        return self.add(
            self.new_request(prompt, params, request_id, checkpoint_positions, cache_salt, priority, fork_of)
        )

    def new_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        checkpoint_positions: list[int] | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        fork_of: str | None = None,
    ) -> RequestState:
        """A checked request, not queued yet (`add` queues it). Touches no engine state, so another thread
        may build requests while this one steps; raises ValueError as `add_request` does."""
        params = params or SamplingParams()
        if params.n != 1:
            raise ValueError(
                f"n must be 1 per engine request (add each branch, see `fork_of`), got {params.n}"
            )
        if priority != 0 and self.config.scheduling_policy != "priority":
            raise ValueError(f"priority must be 0 unless --scheduling-policy priority, got {priority}")
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = None, list(prompt)
            bad = next(
                (t for t in token_ids if not isinstance(t, int) or not 0 <= t < self.spec.vocab_size), None
            )
            if bad is not None:
                raise ValueError(
                    f"prompt token id {bad!r} is outside the vocabulary [0, {self.spec.vocab_size})"
                )
        params = self._bounded(params, len(token_ids))
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        seq = Sequence(request_id, token_ids, params, cache_salt=cache_salt, priority=priority)
        seq.hint_positions = sorted({p for p in checkpoint_positions or [] if 0 < p <= len(token_ids)})
        self.scheduler.check(seq)
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)  # noqa: E731
        req = RequestState.new(seq, text, decode, self.eos_token_ids)
        if params.structured_output is not None:  # GrammarError (a ValueError) names the field
            req.grammar = self.structured.matcher(params.structured_output)
        req.fork_of = fork_of
        return req

    @property
    def context_limit(self) -> int:
        """The most tokens (prompt + output) one request can hold: max_model_len, or the whole KV cache
        if that is less."""
        return min(self.max_model_len, self.cache.max_seq_blocks * self.config.block_size)

    def _bounded(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """`params` checked against the model: ValueError for stop ids or logprobs outside the vocabulary;
        top-k at or past the vocabulary is off; max_tokens None becomes what the context limit leaves
        (the request then ends with "length" there)."""
        vocab, changes = self.spec.vocab_size, {}
        if bad := [t for t in params.stop_token_ids if t >= vocab]:
            raise ValueError(f"stop_token_ids {bad[:4]} are outside the vocabulary [0, {vocab})")
        if bad := sorted(t for t in params.logit_bias or () if t >= vocab):
            raise ValueError(f"logit_bias token ids {bad[:4]} are outside the vocabulary [0, {vocab})")
        if bad := [t for t in params.allowed_token_ids or () if t >= vocab]:
            raise ValueError(f"allowed_token_ids {bad[:4]} are outside the vocabulary [0, {vocab})")
        limit = min(vocab, self.config.max_logprobs)
        if params.logprobs is not None and params.logprobs > limit:
            raise ValueError(
                f"logprobs must be at most {limit} (--max-logprobs and the vocabulary), got {params.logprobs}"
            )
        if params.top_k is not None and params.top_k >= vocab:
            changes["top_k"] = None
        if params.max_tokens is None:
            changes["max_tokens"] = max(self.context_limit - num_prompt_tokens, 1)
        return dataclasses.replace(params, **changes) if changes else params

    def add(self, req: RequestState) -> str:
        """Queue a request from `new_request`; ValueError if its id is in use."""
        request_id = req.seq.request_id
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        first = self.requests.get(req.fork_of) if req.fork_of is not None else None
        if first is not None and first.seq.prompt_token_ids != req.seq.prompt_token_ids:
            raise ValueError(f"fork_of {req.fork_of!r} has another prompt")
        if first is not None and not _prefilled(first.seq):
            # n > 1: one prefill for all branches. This one waits for the first branch's prompt, whose state
            # at its last token but one becomes a checkpoint (a hint, if the first branch has not been
            # admitted yet), and is then admitted on it, computing the last prompt token for its logits.
            hints, end = first.seq.hint_positions, first.seq.num_prompt_tokens - 1
            if end > 0 and end not in hints and first.seq.num_computed_tokens == 0:
                bisect.insort(hints, end)
            self._forks.setdefault(req.fork_of, []).append(req)
        else:
            self.scheduler.add(req.seq)
        self.requests[request_id] = req
        self.stats = snapshot(self.scheduler, self.cache)
        return request_id

    def _release_forks(self, request_id: str) -> None:
        """Queue the branches waiting for `request_id`'s prompt (prefilled, or it left the engine)."""
        for req in self._forks.pop(request_id, ()):
            if not req.seq.is_finished:
                self.scheduler.add(req.seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request wherever it is (queued, mid-prefill, mid-decode) and free what it holds."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        waiting = self._forks.get(req.fork_of or "", [])
        if any(r is req for r in waiting):  # a branch not queued yet
            waiting[:] = [r for r in waiting if r is not req]
            req.seq.status = SequenceStatus.FINISHED
            req.seq.finish_reason = "abort"
        else:
            self.scheduler.finish(req.seq, "abort")
        req.seq.stats.finished_time = time.monotonic()
        out = self._output(req, "")
        self.stats = snapshot(self.scheduler, self.cache)  # an idle engine takes no step to show it
        return out

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0 or any(self._forks.values())

    # ---- the loop -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self.trace is None:
            outputs = self._step()[1]
        else:
            start = self._scheduled_at = time.monotonic()
            ahead = self._in_flight is not None
            batch, outputs = self._step()
            graphed = batch is not None and self._graphed
            self.trace.record(start, self._scheduled_at, batch, self.scheduler, ahead, self.host, graphed)
        self._failed_steps = 0
        self.stats = snapshot(self.scheduler, self.cache)
        return outputs

    def _step(self) -> tuple[ScheduledBatch | None, list[RequestOutput]]:
        self._stepping = []
        if self._in_flight is not None:
            batch, flight = self._in_flight
            self._in_flight = None
            self._stepping = list(batch.seqs)
            self._graphed = flight.graphed
            return batch, self._pipeline(batch, flight)
        batch = self.scheduler.schedule()
        self._scheduled_at = time.monotonic()
        refused = self._refused()
        if not batch.seqs:
            return None, refused
        self._stepping = list(batch.seqs)
        # A grammar's mask needs the tokens before it: constrained batches never run a step ahead.
        constrained = any(s.params.structured_output is not None for s in batch.seqs)
        if self._may_pipeline() and self.runner.is_decode(batch) and not constrained:
            flight = self.runner.launch(batch)
            self._graphed = flight.graphed
            return batch, refused + self._pipeline(batch, flight)
        out = self.runner.run(batch, self._grammar_bitmask if constrained else None)
        self._graphed = self.runner.graphed
        return batch, refused + self._postprocess(batch, out)

    def _refused(self) -> list[RequestOutput]:
        """Outputs of the requests the scheduler refused in its last `schedule()`."""
        failed, self.scheduler.failed = self.scheduler.failed, []
        return [self._retire(seq) for seq in failed]

    def _retire(self, seq: Sequence) -> RequestOutput:
        """The last output of a request finished with an error, which leaves the engine."""
        seq.stats.finished_time = time.monotonic()
        logger.warning("request %s failed: %s", seq.request_id, seq.error)
        return self._output(self.requests.pop(seq.request_id), "")

    # ---- failures -------------------------------------------------------------------------------

    def recover(self, error: Exception) -> list[RequestOutput]:
        """After `step()` raised `error`: go on without the request that caused it, or raise.

        The sequences of the failed step may hold half-written KV and states: each is released and
        recomputed as a suspect (Scheduler.requeue), which then runs alone until it has sampled past this
        point. A sequence that was alone in the failed step, or has been in MAX_FAULTS of them, caused it:
        it finishes with "error" (its output is returned). Raises when the failure is not a request's: it
        came before a batch was chosen, the device cannot go on, MAX_FAILED_STEPS_IN_A_ROW steps failed
        with none succeeding between them (a dead tensor-parallel worker fails every step), or the pools'
        integrity check fails."""
        stepping, self._stepping = self._stepping, []
        self._failed_steps += 1
        if not stepping or self._failed_steps >= MAX_FAILED_STEPS_IN_A_ROW:
            raise error
        self._in_flight = None
        self.runner.forget_batches()  # on CUDA, synchronizes: a device that faulted raises here
        self.scheduler.abandon_step()
        unique = {id(s): s for s in stepping}.values()
        seqs = [s for s in unique if not s.is_finished and s.request_id in self.requests]
        outputs = []
        for seq in seqs:
            seq.faults += 1
            if len(seqs) == 1 or seq.faults >= MAX_FAULTS:
                self.scheduler.finish(seq, "error")
                seq.error = f"the engine failed while serving this request ({type(error).__name__}: {error})"
                outputs.append(self._retire(seq))
            elif seq.status is SequenceStatus.RUNNING:
                self.scheduler.requeue(seq)
        self.check_integrity()
        logger.warning(
            "engine step failed (%s: %s): %d request(s) failed, %d recomputed alone",
            type(error).__name__, error, len(outputs), len(seqs) - len(outputs),
        )  # fmt: skip
        return outputs

    # ---- async scheduling: launch step n+1 while step n runs ---------------------------------------
    # Step n (a pure decode batch) is on the device. Before reading its tokens, the sequences that surely
    # go on (not at max_tokens) get their next block allocated and step n+1 is launched, its inputs being
    # step n's sampled tokens on the device. A sequence whose step-n token is a stop id (eos or
    # stop_token_ids) runs step n+1 into the pad block and slot, so its KV and the state the prefix cache
    # commits at its end are untouched; its step-n+1 row is dropped when read, as is the row of a request
    # aborted meanwhile. Anything else that could make step n+1 differ from what `schedule()` would pick
    # (stop strings, which need text; a waiting request that could be admitted; a host restore whose fetch
    # has finished; a sequence outside the batch; a block the cache cannot give without preempting) makes
    # the engine read step n first.

    def _may_pipeline(self) -> bool:
        return (
            self.config.async_scheduling and self.runner.inputs is not None and self.runner.on_logits is None
        )

    def _pipeline(self, batch: ScheduledBatch, flight: InFlight) -> list[RequestOutput]:
        """`batch` runs on the device as `flight`: launch the step after it if that is safe, then read and
        post-process `batch`."""
        nxt = self._next_decode(batch) if self._may_pipeline() else None
        if nxt is not None:
            self._stepping += nxt.seqs
            stops = [self.requests[s.request_id].eos | self.requests[s.request_id].stop_ids for s in nxt.seqs]
            self._in_flight = (nxt, self.runner.launch_ahead(nxt.seqs, flight, stops))
        out = self.runner.collect(flight)
        live = [i for i, s in enumerate(batch.seqs) if not s.is_finished]
        if len(live) < len(batch):  # stopped by their previous token (this row ran masked) or aborted
            batch = ScheduledBatch([batch.seqs[i] for i in live], [1] * len(live))
            out.token_ids = [out.token_ids[i] for i in live]
            out.logprobs = [out.logprobs[i] for i in live]
            if out.top is not None:
                out.top = [out.top[i] for i in live]
        return self._postprocess(batch, out)

    def _next_decode(self, batch: ScheduledBatch) -> ScheduledBatch | None:
        """The decode batch after `batch` (whose tokens are not read yet), if it is what `schedule()` would
        give; its blocks allocated. None: read `batch` first and let the scheduler decide."""
        sched = self.scheduler
        if sched.could_admit() or sched.restore_ready():
            return None
        if sched.isolating:
            return None
        seqs = [s for s in batch.seqs if not s.is_finished]
        if len(seqs) != len(sched.running):
            return None
        nxt = []
        for seq in seqs:
            req = self.requests[seq.request_id]
            if req.stop is not None or seq.params.adjusts_logits or req.grammar is not None:
                # they need the token in flight
                return None
            if req.max_len is not None and len(seq.token_ids) + 1 >= req.max_len:
                continue  # the token in flight is its last
            if seq.num_computed_tokens + 2 > self.max_model_len:
                return None
            nxt.append(seq)
        if not nxt or len(nxt) > self.runner.inputs.max_batch:
            return None
        if not sched.reserve_decode(nxt, 2):
            return None
        return ScheduledBatch(nxt, [1] * len(nxt))

    def _grammar_bitmask(self, seqs: list[Sequence]) -> torch.Tensor | None:
        """The host token bitmask of a step's sampling rows (ModelRunner.run calls it while the forward
        runs); None when none of them is constrained."""
        return self.structured.bitmask([self.requests[s.request_id].grammar for s in seqs])

    def _postprocess(self, batch: ScheduledBatch, out: StepOutput) -> list[RequestOutput]:
        """A step's results: its timing into the requests' stats, then the scheduler's update (cache and
        sequences; `on_token` decides each stop), then one output per request that sampled."""
        token_ids, logprobs, seconds, top = out.token_ids, out.logprobs, out.seconds, out.top
        now = time.monotonic()
        total = sum(batch.num_tokens)
        for seq, n in zip(batch.seqs, batch.num_tokens, strict=True):
            stats = seq.stats
            if stats.first_scheduled_time is None:
                stats.first_scheduled_time = now
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                stats.prefill_seconds += seconds * n / total
        requests = self.requests
        deltas: dict[str, str] = {}  # text released this step, of requests with stop strings

        def on_token(i: int, seq: Sequence, token: int) -> Finish | None:
            req = requests[seq.request_id]
            if seq.params.logprobs is not None:
                seq.logprobs.append(logprobs[i])
                req.top_logprobs.append(top[i] if top is not None and top[i] is not None else [])
            if seq.stats.first_token_time is None:
                seq.stats.first_token_time = now
            ended = req.grammar is not None and req.grammar.advance(token)
            if req.stop is None:
                finish = req.finish_by_ids(token, len(seq.token_ids))
                return GRAMMAR_END if ended and finish is None else finish
            delta = req.stop.append(token)
            if ended and req.stop.finish is None:  # the text held for a possible stop string goes out
                req.stop.finish = GRAMMAR_END
                delta += req.stop._release()
            deltas[seq.request_id] = delta
            req.text += delta
            return req.stop.finish

        outputs = []
        for seq in self.scheduler.update_from_output(batch, token_ids, on_token):
            req = requests[seq.request_id]
            if seq.is_finished:
                seq.stats.finished_time = now
                if self.trace is not None:
                    self.trace.record_request(seq)
                del requests[seq.request_id]
            outputs.append(self._output(req, deltas.get(seq.request_id, "")))
        return outputs

    def _output(self, req: RequestState, delta_text: str) -> RequestOutput:
        seq = req.seq
        if seq.request_id in self._forks and (seq.is_finished or _prefilled(seq)):
            self._release_forks(seq.request_id)
        end = len(seq.token_ids)
        prev, req.num_reported = req.num_reported, end
        return RequestOutput(
            seq.request_id,
            req.prompt_token_ids,
            seq.token_ids,
            seq.num_prompt_tokens,
            prev,
            end,
            seq.is_finished,
            seq.finish_reason,
            seq.stop_reason,
            seq.logprobs if seq.params.logprobs is not None else None,
            seq.stats,
            req.prompt,
            req.stream if req.stream is not None else (req.text, delta_text),
            seq.error,
            req.top_logprobs if seq.params.logprobs is not None else None,
        )

    def reset_prefix_cache(self) -> int:
        return self.scheduler.reset_cache()

    def close(self) -> None:
        """Finish the host tier's pending write-backs and leave its store, and stop the tensor-parallel
        workers (idempotent). The engine cannot step afterwards."""
        host, self.host = getattr(self, "host", None), None
        if host is not None:
            host.close()
        trace, self.trace = getattr(self, "trace", None), None
        if trace is not None:
            trace.close()
        if hasattr(self, "compiles"):
            self.compiles.uninstall()
        kernels, self.kernels = getattr(self, "kernels", None), None
        if kernels is not None:  # with the variants compiled while serving, for the next start
            kernels.save()
        if self.tp is not None:
            if hasattr(self, "runner"):  # graphs holding NCCL kernels go before the NCCL group
                self.runner.release_graphs()
            self.tp.shutdown()

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()


def _prefilled(seq: Sequence) -> bool:
    """The prompt is computed (its first token sampled): its checkpoints are in the cache."""
    return len(seq.token_ids) > seq.num_prompt_tokens
