"""Sequence: one request's tokens and the cache resources it owns (a shared type: the engine, the cache and
the simulator all hold it, so it sits below them).

    | < prompt: num_prompt_tokens > | < generated > |
    | < computed: KV + state exist: num_computed_tokens > | < to compute > |
The working state slot holds the recurrent state right after token num_computed_tokens - 1.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from flashstate.sampling_params import SamplingParams, request_generator


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RESTORING = "restoring"  # admitted; its state is on the way from the host tier (seq.restore)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class RequestStats:
    arrival_time: float
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens restored from the prefix cache (last admission)
    admitted_time: float | None = None  # left the waiting queue (last admission), to run or to restore
    first_admitted_time: float | None = None  # left it the first time (vllm:request_queue_time_seconds)
    fetched_time: float | None = None  # its host restore's fetch finished (host restores only)
    running_time: float | None = None  # joined the running batch (after its host restore, if any)
    first_scheduled_time: float | None = None  # the end of its first step
    first_token_time: float | None = None
    finished_time: float | None = None
    prefill_seconds: float = 0.0  # model time spent on this request's prompt chunks
    num_preemptions: int = 0
    num_resumed_tokens: int = 0  # tokens restored at its last re-admission after a preemption
    cache_counted: bool = False  # the prefix-cache lookup is in the cache's counters

    def admit(self, now: float) -> None:
        self.admitted_time = now
        if self.first_admitted_time is None:
            self.first_admitted_time = now

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass(slots=True)
class Sequence:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    state_slot: int | None = None
    cache_handle: object | None = None  # the prefix cache's lock on the matched path
    # a host-tier restore in flight (status RESTORING): a cache.host.restore.HostRestore, which this
    # module, below the cache, does not import
    restore: object | None = None
    # its host hit read ahead while it waits (a cache.host.prefetch.HostPrefetch): taken over by its restore
    # at admission, or dropped
    prefetch: object | None = None
    host_chain: list[bytes] = field(default_factory=list)  # host-tier chunk hashes of token_ids so far
    cache_salt: str | None = None  # prefix-cache hits only between requests of the same salt (vLLM's)
    priority: int = 0  # with the priority scheduling policy: lower is admitted first (vLLM's)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    error: str | None = None  # why the engine failed this request (finish_reason "error")
    # Engine steps that raised with this sequence in the batch; while suspect_until >= len(token_ids) the
    # scheduler runs it alone (from a recompute), so a failure it alone causes is told from its batch's.
    faults: int = 0
    suspect_until: int = 0
    logprobs: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None
    # Prompt token counts where the caller suggests checkpoints (chat-message ends).
    hint_positions: list[int] = field(default_factory=list)
    # Token counts where the prefix cache wants the prefill to export a checkpoint (set at admission).
    export_plan: list[int] = field(default_factory=list)
    stats: RequestStats = field(default_factory=lambda: RequestStats(time.monotonic()))

    def __post_init__(self) -> None:
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)
        self.stats.num_prompt_tokens = self.num_prompt_tokens
        if self.generator is None:
            self.generator = request_generator(self.params)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than the last sampled token is still to compute."""
        return self.num_uncomputed > 1 or not self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
