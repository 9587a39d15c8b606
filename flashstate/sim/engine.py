"""SimEngine: the real scheduler and cache manager, with pools as counters and time from the profile.

One step, as in engine/llm_engine.py, with the model run replaced by its modelled duration:

    batch = scheduler.schedule()             at time t (admission stamps the cache with t)
    seconds = profile: Σ C(p + n) − C(p) over prefill chunks (+ step_s if any, graphed_step_s instead
              for a step a MixedGraphs bucket takes under --mixed-step-graphs) + decode(B, Σ context),
              times the profile's noise factor for its kind of step (drawn from the engine's own stream)
    finish_step(batch)                       at t + seconds: exports committed, lengths advanced,
                                             a token appended where the chunk reaches the end

A generated token is a pseudo-random id drawn from the request's own stream (greedy decoding on a real
model also gives each request its own output). A request stops after `max_tokens` (ignore_eos).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.cache_tensors import kv_dtype
from flashstate.cache.cost import PrefillCost
from flashstate.cache.host.build import host_capacity
from flashstate.cache.manager import CacheManager
from flashstate.cache.memory_plan import CachePlan, plan_cache, vllm_page_pool
from flashstate.cache.policy import build_policy
from flashstate.cache.state_pool import StatePool
from flashstate.config import EngineConfig
from flashstate.engine.output.stop_checker import Finish
from flashstate.engine.request_state import LENGTH
from flashstate.engine.scheduler import ScheduledBatch, Scheduler
from flashstate.engine.step_shapes import MAX_EXPORTS, MixedBuckets, decode_shaped
from flashstate.engine.step_trace import request_row, step_shape
from flashstate.sampling_params import SamplingParams
from flashstate.sequence import RequestStats, Sequence
from flashstate.sim.host import SimHostTier
from flashstate.sim.profile import (
    MEASURED_2B_HOST_CALLS,
    NO_STEP_EVENTS,
    NO_STEP_NOISE,
    DecodeModel,
    HostCallCosts,
    StepEvents,
    StepNoise,
)
from flashstate.spec.model_spec import DTYPES, ModelSpec


@dataclass(slots=True)
class SimRequest:
    seq: Sequence
    on_first_token: Callable[[float], None] | None = None
    on_finish: Callable[[float], None] | None = None
    rng: random.Random = field(default_factory=random.Random)
    first_step_s: float = 0.0  # the engine thread's extra time on the step that first runs it


def step_seconds(
    batch: ScheduledBatch, prefill: PrefillCost, decode: DecodeModel, prefill_step_s: float = 0.0
) -> float:
    """Modelled duration of one step (module docstring)."""
    seconds, decodes, context = 0.0, 0, 0
    for seq, n in zip(batch.seqs, batch.num_tokens, strict=True):
        p = seq.num_computed_tokens
        if p >= seq.num_prompt_tokens:  # the last sampled token: a decode
            decodes += 1
            context += p + n
        else:
            seconds += prefill(p + n) - prefill(p)
    if decodes < len(batch.seqs):
        seconds += prefill_step_s
    return seconds + decode(decodes, context)


def host_tier(
    config: EngineConfig,
    spec: ModelSpec,
    dtype: torch.dtype,
    cost: PrefillCost,
    clock: Callable[[], float],
    calls: HostCallCosts = MEASURED_2B_HOST_CALLS,
) -> SimHostTier | None:
    """The host tier the config asks for, holding what the real one may fill."""
    if config.host_tier is None:
        return None
    capacity, chunk = host_capacity(config)[1], config.host_chunk_tokens
    kv = kv_dtype(config.kv_cache_dtype, dtype)
    inline, prefetch = config.host_inline, config.host_prefetch
    return SimHostTier(
        spec, dtype, config.block_size, capacity, cost, clock, chunk, inline, kv, calls, prefetch
    )


class SimEngine:
    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        dtype: str,
        prefill: PrefillCost,
        decode: DecodeModel,
        clock: Callable[[], float],
        max_token_id: int = 256,
        prefill_step_s: float = 0.0,
        graphed_step_s: float | None = None,
        graphed_max_exports: int = MAX_EXPORTS,
        charge_host_calls: bool = True,
        engine_cost: PrefillCost | None = None,  # the engine's cost model where it is not `prefill`
        host_calls: HostCallCosts = MEASURED_2B_HOST_CALLS,  # the engine thread in the host tier's calls
        events: StepEvents = NO_STEP_EVENTS,  # the engine thread per request a step admits or finishes
        noise: StepNoise = NO_STEP_NOISE,  # steps' spread around their price
        noise_seed: str = "0",
    ):
        self.config = config
        self.events = events
        self.noise, self._noise_rng = noise, random.Random(noise_seed)
        self.charge_host_calls = charge_host_calls  # False: the profile's steps already hold them
        self.prefill, self.decode, self.prefill_step_s = prefill, decode, prefill_step_s
        # the simulated GPU graphs mixed steps as the engine would, where the profile has their cost
        graphed = config.graphs_mixed_steps(graphed_step_s is not None)
        if graphed and graphed_step_s is None:
            raise ValueError(
                "--mixed-step-graphs: the profile has no prefill.graphed_step_s (a graphed mixed step's cost)"
            )
        self.graphed_step_s = graphed_step_s
        torch_dtype = DTYPES[dtype]
        budget = config.kv_cache_memory_bytes or config.cpu_cache_memory_bytes
        self.plan: CachePlan = plan_cache(spec, config, torch_dtype, budget)
        # The engine's cost model is its calibration on the hardware: here, the profile's C(n).
        cost = engine_cost or prefill
        if config.prefill_cost_coefficients is not None:
            cost = PrefillCost(*config.prefill_cost_coefficients, source="given")
        self.host = host_tier(config, spec, torch_dtype, cost, clock, host_calls)
        self.cache = CacheManager(
            BlockPool(self.plan.num_blocks, config.block_size),
            StatePool(self.plan.num_slots),
            build_policy(config, spec, torch_dtype, cost),
            max_checkpoints=self.plan.max_checkpoints,
            copy_block=lambda src, dst: None,
            clock=clock,
            host=self.host,
            pages=vllm_page_pool(self.plan, config, spec, torch_dtype),
            byte_budget=self.plan.shared_bytes,
            working_charged=self.plan.working_charged,
        )
        self.max_model_len = config.max_model_len or spec.max_position_embeddings
        self.scheduler = Scheduler.from_config(self.cache, config, self.max_model_len)
        width = -(-self.max_model_len // config.block_size)
        self.buckets = (
            MixedBuckets(config.block_size, width, config.max_num_seqs, max_exports=graphed_max_exports)
            if graphed
            else None
        )
        self._clock = clock
        self._max_token_id = max_token_id
        self._requests: dict[int, SimRequest] = {}  # by id(seq)
        self.busy = False  # a step is in flight
        self.decode_runs = True  # start_decode_run may fold pure decode steps (off: step by step)
        # The engine's async scheduling: while a pure decode step runs, the step after it is already
        # launched when nothing waiting could be admitted at its start (LLMEngine._next_decode). A request
        # arriving meanwhile waits for that next step too. True: the step starting next is such a step.
        self.pipelines = config.async_scheduling and not config.enforce_eager
        self._launched_ahead = False
        self.steps = 0
        self.busy_seconds = 0.0
        self._pending_s = 0.0  # the engine thread's time on requests added since the last step (add's)
        self._first_step_costs = False  # a request added so far has a first-step cost (chat mode)
        # `--step-trace`'s fields, in the order of bench.step_summary.STEP_FIELDS, and its request lines
        self.step_rows: list[tuple] = []
        self.request_rows: list[dict] = []

    def add(
        self,
        request_id: str,
        prompt: list[int],
        max_tokens: int,
        seed: int,
        on_first_token: Callable[[float], None] | None = None,
        on_finish: Callable[[float], None] | None = None,
        hint_positions: list[int] | None = None,
        engine_seconds: float = 0.0,
        first_step_seconds: float = 0.0,
    ) -> Sequence:
        """Queue a request; raises RequestTooLargeError (a ValueError) when it can never run.
        `engine_seconds`: the engine thread's time the request took before it arrived (a chat prompt's
        rendering), which the next step waits out; `first_step_seconds`: its extra time on the engine
        thread in the step that first runs it (a chat prompt's admission)."""
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        seq = Sequence(request_id, list(prompt), params, stats=RequestStats(self._clock()))
        seq.hint_positions = sorted({p for p in hint_positions or [] if 0 < p <= len(prompt)})
        self.scheduler.add(seq)
        self._pending_s += engine_seconds
        self._first_step_costs |= first_step_seconds > 0
        self._requests[id(seq)] = SimRequest(
            seq, on_first_token, on_finish, random.Random(seed), first_step_seconds
        )
        return seq

    def next_restore(self) -> float | None:
        """When the first host restore in flight lands (None: none is)."""
        return min((s.restore.ready_at for s in self.scheduler.restoring), default=None)

    @property
    def has_work(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def start_step(self) -> tuple[ScheduledBatch, float] | None:
        """Schedule a batch; its modelled duration. None when nothing can run."""
        sched = self.scheduler
        if self._launched_ahead:  # decided at the previous step's start: its running set decodes
            self._launched_ahead = False
            held = list(sched.waiting)
            sched.waiting.clear()
            try:
                batch = sched.schedule()
            finally:
                sched.waiting.extend(held)
        else:
            batch = sched.schedule()
        if not batch.seqs:
            return None
        self.busy = True
        self._launched_ahead = self.pipelines and decode_shaped(batch) and self._next_launches_ahead(batch)
        graphed = self.buckets is not None and self.buckets.bucket(batch) is not None
        fixed = self.graphed_step_s if graphed else self.prefill_step_s
        seconds = step_seconds(batch, self.prefill, self.decode, fixed)
        seconds *= self.noise.factor(self._noise_rng, decode_shaped(batch))
        host = self._host_seconds()
        seconds += host + self._take_pending() + self._first_step_seconds(batch)
        if self.events != NO_STEP_EVENTS:  # the shipped profiles price none: no count per step
            seconds += self.events(*self._events(batch))
        self.steps += 1
        self.busy_seconds += seconds
        decode_graph = not self.config.enforce_eager and decode_shaped(batch)
        self._record(self._clock(), seconds, batch, graphed=graphed or decode_graph, host_s=host)
        return batch, seconds

    @staticmethod
    def _events(batch: ScheduledBatch) -> tuple[int, int]:
        """(requests `batch` runs for the first time, requests it finishes): each runs its first step the
        step it is admitted in (a restored one, the step its restore lands in), and every simulated request
        ends at its max_tokens."""
        first = sum(s.stats.first_scheduled_time is None for s in batch.seqs)
        last = sum(
            batch.samples(i) and len(s.token_ids) - s.num_prompt_tokens + 1 >= s.params.max_tokens
            for i, s in enumerate(batch.seqs)
        )
        return first, last

    def _first_step_seconds(self, batch: ScheduledBatch) -> float:
        """The extra engine time of the requests `batch` runs for the first time."""
        if not self._first_step_costs:  # token mode: none has any, no walk over the batch
            return 0.0
        requests = self._requests
        return sum(requests[id(s)].first_step_s for s in batch.seqs if s.stats.first_scheduled_time is None)

    def _take_pending(self) -> float:
        """The engine thread's time on the chat prompts rendered since the last step took it, which the
        step waits out."""
        seconds, self._pending_s = self._pending_s, 0.0
        return seconds

    def _host_seconds(self) -> float:
        """The engine thread's time in the host tier's calls since the last step that took it (write-backs of
        the requests finished since, this schedule's lookups and restores), which the step waits out."""
        if self.host is None:
            return 0.0
        seconds = self.host.take_engine_seconds()
        return seconds if self.charge_host_calls else 0.0

    def _next_launches_ahead(self, batch: ScheduledBatch) -> bool:
        """Whether the engine launches the step after the decode `batch` before reading it: nothing waiting
        could be admitted, no restore has landed, every running sequence is in `batch` and one goes on."""
        sched = self.scheduler
        if sched.could_admit() or sched.restore_ready() or sched.isolating:
            return False
        if len(batch.seqs) != len(sched.running):
            return False
        return any(len(s.token_ids) - s.num_prompt_tokens + 1 < s.params.max_tokens for s in batch.seqs)

    def start_decode_run(self, max_seconds: float) -> tuple[int, float] | None:
        """Run k > 1 pure decode steps at once when they are exactly what k `start_step`s would do: nothing
        waits, or under memory admission nothing waiting fits beside the running set (no admission attempt
        could stamp the cache), every running sequence decodes, none reaches
        its last token, the KV blocks for all k tokens are free (no eviction, no preemption; for the vllm
        policy, its emulated page pool's pages too), and the k steps end within `max_seconds` (before any
        other event), and no host restore is in flight. Returns
        (k, seconds), or None."""
        sched = self.scheduler
        running = sched.running
        if (
            not self.decode_runs
            or (sched.waiting and (sched.admission is None or not sched.admission_blocked()))
            or sched.restoring  # each step polls the restores: a run would land them late
            or not running
            or len(running) > sched.max_num_batched_tokens
        ):
            return None
        left, context = None, 0
        for seq in running:
            if seq.num_uncomputed != 1 or seq.num_computed_tokens < seq.num_prompt_tokens:
                return None
            todo = seq.params.max_tokens - (len(seq.token_ids) - seq.num_prompt_tokens)
            left = todo if left is None else min(left, todo)
            context += seq.num_computed_tokens + 1
        b, k, seconds = len(running), 0, 0.0
        while k < left - 1:
            step = self.decode(b, context + k * b) * self.noise.factor(self._noise_rng, True)
            if seconds + step >= max_seconds:
                break
            seconds += step
            k += 1
        if k < 2:
            return None
        pool = self.cache.block_pool
        need = sum(max(pool.blocks_for(s.num_computed_tokens + k) - len(s.block_table), 0) for s in running)
        if need > self.cache.num_free_blocks:
            return None
        pages = self.cache.pages  # the vllm policy's emulated pool binds too: the k steps take its pages
        if pages is not None:
            for s in running:  # what the next step's allocations do first: catch up on the pool's steps
                pages.advance(s.request_id, s.token_ids, s.num_computed_tokens)
            grow = sum(pages.pages_to_grow(s.request_id, s.num_computed_tokens + k) for s in running)
            if grow > pages.num_free:
                return None
        sched.run_decodes(k, lambda seq: self._requests[id(seq)].rng.randrange(self._max_token_id))
        self.busy = True
        # nothing waiting fits: the step after the run's last was launched during it
        self._launched_ahead = self.pipelines
        self.steps += k
        self.busy_seconds += seconds
        self._record(self._clock(), seconds, None, b, context, k, graphed=not self.config.enforce_eager)
        return k, seconds

    def _record(self, start: float, seconds: float, batch: ScheduledBatch | None, decodes: int = 0,
                context: int = 0, repeat: int = 1, graphed: bool = False,
                host_s: float = 0.0) -> None:  # fmt: skip
        """Step rows as `--step-trace` writes them: `batch` before it runs, or (a folded run of `repeat`
        decode steps taking `seconds` in all) `decodes` sequences holding `context` tokens at the first;
        `graphed` as the engine would have run it; `host_s` of the step's seconds in the host tier's calls
        (a single step's). The running and waiting counts are the scheduler's now,
        and the step's end sets the last row's (`_counted`), as a server's trace counts them after a step."""
        tokens = seqs = pairs = exports = 0
        if batch is not None:
            tokens, seqs, decodes, pairs, context = step_shape(batch.seqs, batch.num_tokens, computed=False)
            exports = len(batch.exports)
        sched = self.scheduler
        ms = 1e3 * seconds / repeat
        self.step_rows.extend(
            (
                start + i * ms / 1e3,
                ms,
                tokens,
                seqs,
                decodes,
                len(sched.running),
                len(sched.waiting),
                pairs,
                context + i * decodes,
                graphed,
                exports,
                round(1e3 * host_s, 3),
            )  # fmt: skip
            for i in range(repeat)
        )

    def _counted(self) -> None:
        """The last step row's running and waiting counts as the step left them."""
        if self.step_rows:
            row, sched = self.step_rows[-1], self.scheduler
            self.step_rows[-1] = (*row[:5], len(sched.running), len(sched.waiting), *row[7:])

    def finish_decode_run(self) -> None:
        self.busy = False
        self._counted()

    def finish_step(self, batch: ScheduledBatch) -> None:
        """The step's results at its end time, through the scheduler's update as in the engine."""
        self.busy = False
        now = self._clock()
        for seq in batch.seqs:
            if seq.stats.first_scheduled_time is None:
                seq.stats.first_scheduled_time = now
        tokens = [
            self._requests[id(seq)].rng.randrange(self._max_token_id) if batch.samples(i) else None
            for i, seq in enumerate(batch.seqs)
        ]

        def on_token(i: int, seq: Sequence, token: int) -> Finish | None:
            req = self._requests[id(seq)]
            if seq.stats.first_token_time is None:
                seq.stats.first_token_time = now
                if req.on_first_token is not None:
                    req.on_first_token(now)
            return LENGTH if len(seq.token_ids) - seq.num_prompt_tokens >= seq.params.max_tokens else None

        done: list[SimRequest] = []
        for seq in self.scheduler.update_from_output(batch, tokens, on_token):
            if seq.is_finished:
                seq.stats.finished_time = now
                self.request_rows.append(request_row(seq, 0.0))
                done.append(self._requests.pop(id(seq)))
        self._counted()
        for req in done:
            if req.on_finish is not None:
                req.on_finish(now)
