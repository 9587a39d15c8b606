"""Scheduler: continuous batching with chunked prefill under a token budget.

Each step, in FIFO order of admission:
  1. running sequences: a decode takes 1 token, a prefill the next chunk (as much as the budget allows);
     when KV blocks run out, the most recently admitted running sequence is preempted (its blocks and
     slot freed, recomputed later from scratch — first in the waiting queue);
  2. waiting sequences are admitted while budget, `max_num_seqs`, slots and blocks allow; the queue head
     is never skipped (FIFO fairness), and nothing is admitted in a step that preempted.
Prefill chunks and decodes share one batch. With `long_prefill_token_threshold` T > 0 (vLLM's), a sequence
with more than T tokens left computes at most T a step, so a long prefill leaves room for shorter ones.
With `prefill_order` "arrivals-first", while anything waits the running prefills step aside in 1. and take
what budget the admissions of 2. leave, so an arrival is never queued behind a long prefill, and that prefill
still fills the step (a prefill step's cost is mostly fixed: splitting it, as the threshold does, costs
whole steps); and the running prefills take the budget shortest remaining first, so one with a few tokens
left (just restored from the host tier, say) does not wait out a long prompt's chunks.
A sequence whose admission starts a host-tier restore waits in `restoring` (holding its slot and blocks,
counted in `max_num_seqs`, never preempted) while the others run; each step first polls the restores:
a finished one joins `running` at the host depth, a failed one goes back to the head of the queue.

With memory admission (engine/admission.py; the `flashstate` policy's default) step 2 admits in that
module's order only what fits beside the running set's expected footprint, and with checkpoint preemption
(`preemption_mode` "checkpoint", flashstate's default) a preempted sequence leaves its state at its position
as a cache unit it resumes from (CacheManager.preempt); a running set grown past its share preempts so
before its next blocks would evict cached units (`_overgrown`). The `vllm` and `sglang` policies keep the
rules above unchanged.

With `scheduling_policy` "priority" (vLLM's) the waiting queue is ordered by (priority, arrival), lower
first, preempted sequences included, and the preemption victim is the running sequence last in that order.

Liveness: the queue head waits only while something else holds memory that will be freed (running or
restoring sequences). When nothing does and it still cannot be placed (its prefix hit locks the very
checkpoints that would have to go), it is admitted as a miss; if even that fails it is refused
(`failed`, finish reason "error"), never left to block the queue.
Isolation: a sequence whose step raised (LLMEngine.recover) is a suspect until it has sampled past the
point of failure (`Sequence.suspect_until`); while one is, it runs alone, so a failure it causes again is
its own and fails it alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from flashstate.cache.host.restore import wait_any
from flashstate.cache.manager import CacheManager
from flashstate.config import EngineConfig
from flashstate.engine.admission import MemoryAdmission
from flashstate.engine.output.stop_checker import Finish
from flashstate.sequence import Sequence, SequenceStatus


def memory_admission(config: EngineConfig, max_model_len: int) -> MemoryAdmission | None:
    """The config's memory admission: on by default for flashstate's own policy; the policies that stand
    for other engines keep their schedulers (slots and blocks only)."""
    on = config.memory_admission
    if on is None:
        on = config.cache_policy == "flashstate"
    if not on:
        return None
    return MemoryAdmission(
        config.admission_expected_output_tokens,
        config.admission_cache_reserve,
        config.max_queue_wait_seconds,
        max_model_len,
        config.admission_cold_reserve,
    )


def preemption_mode(config: EngineConfig) -> str:
    """The config's preemption mode; by default checkpoint for flashstate's own policy, recompute (what vLLM
    and SGLang do) for the policies that stand for them."""
    if config.preemption_mode is not None:
        return config.preemption_mode
    return "checkpoint" if config.cache_policy == "flashstate" else "recompute"


@dataclass(slots=True)
class SchedulerStats:
    """Counters of the scheduler's overload handling (cumulative)."""

    preemptions_recompute: int = 0  # preempted with nothing kept: recomputed from its prefix hit
    preemptions_checkpoint: int = 0  # preempted into a checkpoint at its position: resumes from it
    admission_blocked: int = 0  # steps an aged request did not fit and held admission back
    max_queue_wait: float = 0.0  # longest arrival-to-first-admission wait so far (seconds, the cache's clock)


def prefill_order(config: EngineConfig) -> str:
    """The config's prefill order; by default arrivals-first for flashstate's own policy, and vLLM's fifo for
    the policies that stand for other engines."""
    if config.prefill_order is not None:
        return config.prefill_order
    return "arrivals-first" if config.cache_policy == "flashstate" else "fifo"


class RequestTooLargeError(ValueError):
    """The request can never be served with this configuration."""


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)  # new tokens of each sequence in this step
    # (index in batch, tokens into its chunk, destination slot): checkpoints exported by this step.
    exports: list[tuple[int, int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, seq: Sequence, n: int, exports: list[tuple[int, int]]) -> None:
        self.exports.extend((len(self.seqs), count, slot) for count, slot in exports)
        self.seqs.append(seq)
        self.num_tokens.append(n)

    def samples(self, i: int) -> bool:
        """The chunk of sequence i reaches its last token: the step samples its next token."""
        seq = self.seqs[i]
        return seq.num_computed_tokens + self.num_tokens[i] == len(seq.token_ids)


class Scheduler:
    def __init__(
        self,
        cache: CacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        long_prefill_token_threshold: int = 0,
        arrivals_first: bool = False,
        by_priority: bool = False,
        admission: MemoryAdmission | None = None,
        preempt_checkpoint: bool = False,
    ):
        self.cache = cache
        self.by_priority = by_priority
        self.arrivals_first = arrivals_first
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.restoring: list[Sequence] = []
        self._suspects = False  # a requeued suspect may still be waiting or running (see _isolated)
        self.failed: list[Sequence] = []  # refused by schedule() (finished, "error"): the engine reports them
        self.admission = admission
        self.preempt_checkpoint = preempt_checkpoint
        self._hits: dict[int, int] = {}  # id(waiting seq) -> its cached depth when queued (admission order)
        self.stats = SchedulerStats()

    @classmethod
    def from_config(cls, cache: CacheManager, config: EngineConfig, max_model_len: int) -> Scheduler:
        return cls(
            cache,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            max_model_len,
            config.long_prefill_token_threshold,
            prefill_order(config) == "arrivals-first",
            config.scheduling_policy == "priority",
            memory_admission(config, max_model_len),
            preemption_mode(config) == "checkpoint",
        )

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.restoring)

    def add(self, seq: Sequence) -> None:
        self.check(seq)
        if self.by_priority:
            self._insert_by_priority(seq)
        else:
            self.waiting.append(seq)
        self._queued(seq)

    def _queued(self, seq: Sequence) -> None:
        if self.admission is not None or self.cache.reads_ahead:
            depth = self.cache.queued(seq)
            if self.admission is not None:
                self._hits[id(seq)] = depth

    def _insert_by_priority(self, seq: Sequence) -> None:
        """Into the waiting queue, which is in (priority, arrival) order: after every sequence not later."""
        key = _priority_key(seq)
        i = len(self.waiting)
        while i > 0 and _priority_key(self.waiting[i - 1]) > key:
            i -= 1
        self.waiting.insert(i, seq)

    def _wait_again(self, seq: Sequence) -> None:
        """A sequence that was admitted waits again: at the head of the queue, or in its priority's place."""
        if self.by_priority:
            self._insert_by_priority(seq)
        else:
            self.waiting.appendleft(seq)
        self._queued(seq)

    def check(self, seq: Sequence) -> None:
        """Raise RequestTooLargeError if `seq` can never run (reads only fixed sizes: any thread may ask)."""
        total = seq.num_prompt_tokens + (seq.params.max_tokens or 0)
        if seq.num_prompt_tokens == 0:
            raise RequestTooLargeError("the prompt is empty")
        if total > self.max_model_len:
            raise RequestTooLargeError(
                f"prompt ({seq.num_prompt_tokens} tokens) + max_tokens ({seq.params.max_tokens}) = {total} "
                f"exceeds max_model_len ({self.max_model_len})"
            )
        if not self.cache.can_ever_fit(total):
            raise RequestTooLargeError(
                f"prompt + max_tokens = {total} tokens exceeds the whole KV cache "
                f"({self.cache.max_seq_blocks * self.cache.block_size} tokens)"
            )

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        preempted = False
        self._poll_restores()
        deferred: list[Sequence] = []  # running prefills that take the budget after the admissions
        only = self._isolated()
        for seq in self._running_order():
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted below for an earlier one's blocks
                continue
            if only is not None and seq is not only:
                continue
            if self.arrivals_first and self.waiting and seq.num_uncomputed > 1:
                deferred.append(seq)
                continue
            n = self._chunk(seq, budget)
            while self._overgrown(seq, n):
                victim = self._victim(batch)
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            while not self.cache.allocate(seq, n):
                victim = self._victim(batch)
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                batch.add(seq, n, self.cache.exports(seq, n))
                budget -= n
        if self.admission is not None:
            if not preempted:
                budget = self._admit_by_memory(batch, budget, only, deferred)
        else:
            while (
                self.waiting
                and budget > 0
                and not preempted
                and len(self.running) + len(self.restoring) < self.max_num_seqs
            ):
                seq = self.waiting[0]
                if only is not None and seq is not only:
                    break
                left = self._try_admit(seq, budget, batch, deferred)
                if left is None:
                    break
                budget = left
        for seq in sorted(deferred, key=lambda s: s.num_uncomputed):
            if only is not None and seq is not only:
                continue
            # never preempts: sequences admitted above are in the batch (and their admission made room for
            # every running sequence's next blocks); one that finds no blocks waits a step
            n = self._chunk(seq, budget)
            if n > 0 and seq.status is SequenceStatus.RUNNING and self.cache.allocate(seq, n):
                batch.add(seq, n, self.cache.exports(seq, n))
                budget -= n
        if not batch.seqs and self.restoring:  # nothing else to run: wait for a restore, not spin
            wait_any([s.restore for s in self.restoring], timeout=0.05)
        return batch

    def _try_admit(
        self, seq: Sequence, budget: int, batch: ScheduledBatch, deferred: list[Sequence]
    ) -> int | None:
        """Admit the waiting `seq`: into `batch` with its first chunk, or into `restoring`; returns the budget
        left. Refused (and out of the queue) when nothing else holds memory and even a miss cannot be
        placed. None: it could not be placed now and holds nothing."""
        admitting = self.cache.clock()  # before admit(): an inline restore is fetched inside it
        if seq.stats.first_admitted_time is None:
            self.stats.max_queue_wait = max(self.stats.max_queue_wait, admitting - seq.stats.arrival_time)
        placed = self._place(seq, budget)
        if not placed and not self.running and not self.restoring:
            # Nothing will free memory for it: take no hit, and refuse it if even that cannot fit.
            placed = self._place(seq, budget, miss=True)
            if not placed:
                self._leave_queue(seq)
                self._refuse(seq, "the cache cannot hold this request even with nothing else running")
                return budget
        if not placed:
            return None
        self._leave_queue(seq)
        if seq.stats.cache_counted:  # re-admitted after a preemption: what it resumed from
            seq.stats.num_resumed_tokens = seq.num_computed_tokens
        n = self._chunk(seq, budget)
        if seq.restore is not None:
            seq.stats.admit(admitting)
            seq.status = SequenceStatus.RESTORING
            self.restoring.append(seq)
            if seq.restore.inline:  # fetched already: the restored sequence takes budget in this step
                self._poll_restore(seq)
                if seq.status is SequenceStatus.RUNNING:
                    deferred.append(seq)
            return budget
        seq.stats.running_time = self.cache.clock()
        seq.stats.admit(seq.stats.running_time)
        self.cache.record_admission(seq)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        batch.add(seq, n, self.cache.exports(seq, n))
        return budget - n

    def _admit_by_memory(
        self, batch: ScheduledBatch, budget: int, only: Sequence | None, deferred: list[Sequence]
    ) -> int:
        """Admission under `MemoryAdmission` (engine/admission.py): in its order, each waiting sequence
        whose expected footprint fits beside the running set's; returns the budget left."""
        adm = self.admission
        now = self.cache.clock()
        if only is not None:  # a suspect at the head runs alone; one running admits nothing
            order = [only] if self.waiting and self.waiting[0] is only else []
        else:
            order = adm.order(list(self.waiting), now, self._hits, self.by_priority)
        used = self._running_footprint(adm)
        for seq in order:
            if budget <= 0 or len(self.running) + len(self.restoring) >= self.max_num_seqs:
                break
            need = adm.footprint(self.cache, seq)
            limit = adm.limit_for(self.cache, seq, now, self._hits)
            if (self.running or self.restoring) and used + need > limit:
                if adm.aged(seq, now):
                    self.stats.admission_blocked += 1
                    break  # never passed over: the running set drains until it fits
                continue
            left = self._try_admit(seq, budget, batch, deferred)
            if left is None:
                break
            budget = left
            if not seq.is_finished:
                used += need
        return budget

    def _running_footprint(self, adm: MemoryAdmission) -> int:
        """The running and restoring sequences' blocks at their expected lengths."""
        return sum(adm.footprint(self.cache, s) for s in self.running + self.restoring)

    def _overgrown(self, seq: Sequence, n: int) -> bool:
        """Under memory admission with checkpoint preemption: `seq`'s next `n` tokens would evict cached units
        while the running set holds more than its share (it outgrew its expected lengths). Then a running
        sequence is preempted into a checkpoint first, so its state competes with the cached units for the
        memory (by the cache's priority) instead of the cached ones going unasked."""
        return self._overgrown_by([seq], n)

    def _overgrown_by(self, seqs: list[Sequence], n: int) -> bool:
        """`_overgrown` for the next `n` tokens of every one of `seqs` together."""
        if self.admission is None or not self.preempt_checkpoint or len(self.running) < 2:
            return False
        blocks_for = self.cache.block_pool.blocks_for
        need = sum(max(blocks_for(s.num_computed_tokens + n) - len(s.block_table), 0) for s in seqs)
        if need <= self.cache.num_free_blocks:
            return False
        live = self.running + self.restoring
        held = sum(len(s.block_table) for s in live) + self.cache.slot_blocks * len(live)
        return held > self.admission.limit(self.cache)

    def could_admit(self) -> bool:
        """Whether `schedule()` might admit a waiting sequence now: one waits, the running set is below
        `max_num_seqs`, and under memory admission one fits beside it (the test the engine makes before it
        launches a decode step ahead)."""
        admits = bool(self.waiting) and len(self.running) < self.max_num_seqs
        if admits and self.admission is not None:
            admits = not self.admission_blocked()
        return admits

    def admission_blocked(self) -> bool:
        """No waiting sequence could be admitted by the next `schedule()` with the running set as it is
        (`max_num_seqs` reached, or none fits beside it under memory admission), and none would be while
        the running sequences only decode: their footprints never shrink."""
        if not self.waiting:
            return True
        if len(self.running) + len(self.restoring) >= self.max_num_seqs:
            return True
        if self.admission is None or not (self.running or self.restoring) or self._suspects:
            return False
        adm = self.admission
        used = self._running_footprint(adm)
        now = self.cache.clock()
        return all(
            used + adm.footprint(self.cache, s) > adm.limit_for(self.cache, s, now, self._hits)
            for s in self.waiting
        )

    def _leave_queue(self, seq: Sequence) -> None:
        self.waiting.remove(seq)
        self._hits.pop(id(seq), None)
        # admitted (a restore took its read-ahead over, or it had no use for one), refused or aborted
        self.cache.drop_prefetch(seq)

    def _place(self, seq: Sequence, budget: int, miss: bool = False) -> bool:
        """Admit `seq` into the cache (its slot, its prefix hit or a host restore; no hit with `miss`) with
        room to run to its first token next to everything already running, so long prompts do not preempt
        each other in turn (evicting cache units to make the room), and unless it restores, the blocks of
        its first chunk. False: it holds nothing."""
        if not self.cache.admit(seq, miss):
            return False
        room = self._blocks_to_first_token(seq) + sum(
            self._blocks_to_first_token(s) for s in self.running + self.restoring
        )
        placed = self.cache.make_room(room) and (
            seq.restore is not None or self.cache.allocate(seq, self._chunk(seq, budget))
        )
        if not placed:
            self.cache.release(seq, commit=False)
            seq.num_computed_tokens = 0
        return placed

    def _refuse(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.error = "error", reason
        self.failed.append(seq)

    def _isolated(self) -> Sequence | None:
        """The suspect that runs alone this step: a running one, else one at the head of the queue."""
        if not self._suspects:  # the steady state: no step has failed since the last suspect cleared
            return None
        for seq in self.running:
            if seq.suspect_until >= len(seq.token_ids):
                return seq
        if self.waiting and self.waiting[0].suspect_until >= len(self.waiting[0].token_ids):
            return self.waiting[0]
        self._suspects = any(s.suspect_until >= len(s.token_ids) for s in self.waiting)
        return None

    @property
    def isolating(self) -> bool:
        return self._isolated() is not None

    def requeue(self, seq: Sequence) -> None:
        """A running sequence whose step failed: everything it holds released, recomputed from the head of
        the queue as a suspect (it runs alone until it has sampled past this point)."""
        self._preempt(seq, count=False)
        self.waiting.remove(seq)
        self.waiting.appendleft(seq)  # a suspect runs next, alone, whatever its priority
        seq.suspect_until = len(seq.token_ids)
        self._suspects = True

    def _running_order(self) -> list[Sequence]:
        """The order running sequences take the budget in: admission order (fifo); with arrivals-first, the
        decodes in admission order, then the prefills shortest remaining first, so a sequence with a few
        tokens left (one just restored from the host tier, say) is not held behind a long prompt's chunks."""
        if not self.arrivals_first:
            return list(self.running)
        decodes = [s for s in self.running if s.num_uncomputed <= 1]
        prefills = [s for s in self.running if s.num_uncomputed > 1]
        return decodes + sorted(prefills, key=lambda s: s.num_uncomputed)

    def _victim(self, batch: ScheduledBatch) -> Sequence:
        """The running sequence to preempt for blocks: the most recently admitted one not yet in `batch`."""
        scheduled = set(map(id, batch.seqs))
        candidates = [s for s in self.running if id(s) not in scheduled]
        if self.by_priority:
            return max(reversed(candidates), key=_priority_key)
        return candidates[-1]

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """The tokens `seq` computes this step: what it has left, within the budget and, for a long prefill,
        the long-prefill threshold."""
        n = seq.num_uncomputed
        if 0 < self.long_prefill_token_threshold < n:
            n = self.long_prefill_token_threshold
        return min(n, budget)

    def restore_ready(self) -> bool:
        """A restore in flight has fetched its state: the next `schedule()` moves its sequence to running."""
        return any(s.restore is not None and s.restore.ready() for s in self.restoring)

    def _poll_restores(self) -> None:
        for seq in list(self.restoring):
            self._poll_restore(seq)

    def _poll_restore(self, seq: Sequence) -> None:
        """A restoring sequence runs once its state has landed, or waits again if its restore failed."""
        restore = seq.restore
        done = self.cache.poll_restore(seq)
        if done is None:
            return
        self.restoring.remove(seq)
        if done:
            seq.stats.fetched_time, seq.stats.running_time = restore.fetched_at, self.cache.clock()
            self.cache.record_admission(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        else:  # the restore failed and released everything: admitted again from the GPU cache
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self._wait_again(seq)

    def _blocks_to_first_token(self, seq: Sequence) -> int:
        need = self.cache.block_pool.blocks_for(len(seq.token_ids) + 1) - len(seq.block_table)
        return max(need, 0)

    def _preempt(self, seq: Sequence, count: bool = True) -> None:
        """Back to the queue with nothing held: into a checkpoint at its position (`preempt_checkpoint`,
        the cache permitting), which its re-admission hits, else recomputed from its prefix hit. `count`
        off (a failed step's sequence, whose state may be half-written): nothing kept, nothing counted."""
        self.running.remove(seq)
        if count and self.preempt_checkpoint and self.cache.preempt(seq):
            self.stats.preemptions_checkpoint += 1
        else:
            self.cache.release(seq, commit=False)
            self.stats.preemptions_recompute += count
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.stats.num_preemptions += count
        self._wait_again(seq)

    def update_from_output(
        self,
        batch: ScheduledBatch,
        token_ids: list[int | None],
        on_token: Callable[[int, Sequence, int], Finish | None],
    ) -> list[Sequence]:
        """Every change a finished step makes to its sequences and the cache, in one place (the engine's and
        the simulator's): checkpoints the step exported committed, computed lengths advanced, each sampled
        token (`token_ids[i]`, None for a row that sampled nothing) appended, then `on_token(i, seq,
        token)` says whether the sequence stops; one that does is retired (its state committed to the cache,
        what it holds released). Returns the sequences that sampled a token, in batch order."""
        for i, count, slot in batch.exports:
            seq = batch.seqs[i]
            self.cache.commit_export(seq, seq.num_computed_tokens + count, slot)
        sampled = []
        for i, (seq, n, token) in enumerate(zip(batch.seqs, batch.num_tokens, token_ids, strict=True)):
            seq.num_computed_tokens += n
            if token is None:
                continue
            seq.token_ids.append(token)
            finish = on_token(i, seq, token)
            if finish is not None:
                seq.stop_reason = finish.stop_reason
                self.finish(seq, finish.reason)
            sampled.append(seq)
        return sampled

    def run_decodes(self, k: int, sample: Callable[[Sequence], int]) -> None:
        """`k` decode steps of every running sequence at once, each appending `sample(seq)`: the simulator's
        folded decode run. The caller has checked what makes it equal to k steps through
        `update_from_output`: nothing waits, no sequence reaches its last token, the blocks are free."""
        for seq in self.running:
            if not self.cache.allocate(seq, k):
                raise AssertionError(f"no KV blocks for {k} decode steps of {seq.request_id}")
            seq.num_computed_tokens += k
            seq.token_ids.extend(sample(seq) for _ in range(k))

    def abandon_step(self) -> None:
        """After a failed step: the slots of the checkpoints it was exporting go back (LLMEngine.recover)."""
        self.cache.abandon_exports()

    def reset_cache(self) -> int:
        """Evict every checkpoint no running sequence holds; returns how many."""
        return self.cache.reset()

    def reserve_decode(self, seqs: list[Sequence], num_tokens: int) -> bool:
        """KV blocks for `num_tokens` more tokens of each sequence, without preempting (a decode launched
        ahead of the step before it); False when the cache is short (blocks already taken stay: the next
        `schedule()` needs them), or when one would have to preempt a sequence into a checkpoint first."""
        if self._overgrown_by(seqs, num_tokens):
            return False
        return all(self.cache.allocate(seq, num_tokens) for seq in seqs)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence (stop, length or abort) from wherever it is and release what it holds."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.RESTORING:
            self.restoring.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self._leave_queue(seq)
        else:
            return
        self.cache.release(seq, commit=reason not in ("abort", "error"))
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def check_integrity(self) -> None:
        for seq in self.waiting:
            if seq.block_table or seq.state_slot is not None or seq.restore is not None:
                raise AssertionError(f"waiting request {seq.request_id} holds cache resources")
        for seq in self.running + self.restoring:
            restoring = seq in self.restoring
            if {seq.status is SequenceStatus.RESTORING, seq.restore is not None} != {restoring}:
                raise AssertionError(f"request {seq.request_id} is {seq.status.value}, restore {seq.restore}")
        self.cache.check_integrity(self.running + self.restoring)


def _priority_key(seq: Sequence) -> tuple[int, float]:
    return seq.priority, seq.stats.arrival_time
