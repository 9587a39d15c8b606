"""StepTrace: one JSON line per engine step (`--step-trace PATH`), to see where a serving load's time goes:
when the step began, how long the call took, what it computed and what was left queued. `prefill_pairs`
(Σ over chunks of (p + n)² − p², a chunk of n tokens resuming at depth p) and `decode_context` (Σ of the
decoding sequences' lengths) are what a step-time model needs beyond the token counts; `graphed`, whether
the step replayed a captured CUDA graph (decode or mixed-step) or ran eager. With a host tier,
`host_ms` is the engine thread's time inside the tier during the step (lookups, restores' copies issued,
write-backs staged) and `host_restores` the restores it issued.

A request that finishes adds a line of its own, told apart by its "request" key: where its time to first
token went (seconds from the trace's origin: arrival, admitted from the queue, its host restore's fetch
done (null without one), running after any host restore, its first step done, first token, finished)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, TextIO

from flashstate.engine.scheduler import ScheduledBatch, Scheduler
from flashstate.sequence import Sequence

if TYPE_CHECKING:
    from flashstate.cache.host.tier import HostTier


def step_shape(seqs: list[Sequence], counts: list[int], computed: bool) -> tuple[int, int, int, int, int]:
    """(prefill tokens, prefill sequences, decoding sequences, prefill pairs, decode context) of a step that
    runs counts[i] tokens of seqs[i]; `computed`: the sequences' num_computed_tokens already include it.
    A sequence still inside its prompt runs a prefill chunk, any other decodes (as the simulator prices
    them)."""
    tokens = prefills = decodes = pairs = context = 0
    for seq, n in zip(seqs, counts, strict=True):
        p = seq.num_computed_tokens - (n if computed else 0)  # depth before the step
        if p < seq.num_prompt_tokens:
            tokens, prefills = tokens + n, prefills + 1
            pairs += n * (2 * p + n)  # (p + n)² − p²: what the chunk's attention grows by
        else:
            decodes, context = decodes + 1, context + p + n
    return tokens, prefills, decodes, pairs, context


def request_row(seq: Sequence, origin: float) -> dict:
    """A finished request's line: its times (seconds from `origin`) from arrival to its end, and sizes."""
    s = seq.stats
    times = (s.arrival_time, s.admitted_time, s.fetched_time, s.running_time, s.first_scheduled_time,
             s.first_token_time, s.finished_time)  # fmt: skip
    names = ("arrival", "admitted", "fetched", "running", "first_scheduled", "first_token", "finished")
    row = {"request": seq.request_id}
    row.update((k, None if t is None else round(t - origin, 6)) for k, t in zip(names, times, strict=True))
    row.update(
        prompt_tokens=s.num_prompt_tokens, cached_tokens=s.num_cached_tokens, preemptions=s.num_preemptions
    )
    return row


class StepTrace:
    def __init__(self, path: str):
        try:
            self._file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 — closed by close()
        except OSError as e:
            raise ValueError(f"step_trace: cannot write {path}: {e.strerror}") from None
        self._origin = time.monotonic()
        self._host_seconds = 0.0
        self._host_restores = 0

    def record(
        self,
        start: float,
        scheduled: float,
        batch: ScheduledBatch | None,
        scheduler: Scheduler,
        ahead: bool,
        host: HostTier | None = None,
        graphed: bool = False,
    ) -> None:
        """time.monotonic() when the step call began and when its batch was scheduled (the start for a
        step launched ahead); `batch`: what it ran (None: nothing)."""
        end = time.monotonic()
        seqs, counts = (batch.seqs, batch.num_tokens) if batch is not None else ([], [])
        tokens, prefills, decodes, pairs, context = step_shape(seqs, counts, computed=True)
        row = {
            "t": round(start - self._origin, 6),
            "ms": round(1e3 * (end - start), 3),
            "schedule_ms": round(1e3 * (scheduled - start), 3),
            "prefill_tokens": tokens,
            "prefill_seqs": prefills,
            "decode_seqs": decodes,
            "prefill_pairs": pairs,
            "decode_context": context,
            "exports": len(batch.exports) if batch is not None else 0,  # recurrent states checkpointed
            "ahead": ahead,  # launched during the step before (async scheduling), not scheduled by this one
            "graphed": graphed,
            "running": len(scheduler.running),
            "waiting": len(scheduler.waiting),
        }
        if host is not None:
            stats = host.stats
            row["host_ms"] = round(1e3 * (stats.engine_seconds - self._host_seconds), 3)
            row["host_restores"] = stats.restores - self._host_restores
            self._host_seconds, self._host_restores = stats.engine_seconds, stats.restores
        self._file.write(json.dumps(row) + "\n")

    def record_request(self, seq: Sequence) -> None:
        self._file.write(json.dumps(request_row(seq, self._origin)) + "\n")

    def close(self) -> None:
        self._file.close()
