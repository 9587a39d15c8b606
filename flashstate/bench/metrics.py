"""Client-side metrics (DESIGN.md §7) from per-request and per-session records, and the server's /metrics.

    prompt tokens      usage.prompt_tokens (the tokens sent when the server does not say)
    cached tokens      usage.prompt_tokens_details.cached_tokens: restored from a hybrid state
    uncached tokens    prompt − cached: what was prefilled
    token hit rate     Σ cached / Σ prompt
    TTFT               send → first streamed token, client clock
    output TPM         output tokens streamed inside the measured window per minute (a request's tokens are
                       spread evenly over [first token, end])
    completed agents   top-level sessions whose every turn (and sub-agent) ran inside the window
    prefill / decode   uncached tokens / output tokens per minute per GPU
    short of frontier  a turn that re-sent its whole context (a continuation) and got fewer cached tokens
                       than the previous turn's prompt + output − 1: its prompt left the cached path earlier
                       (chat mode: the template re-rendered the history differently) or was evicted

The measured window is [start, end) in seconds since the run began; a request belongs to it by its send
time. Errors are counted, never measured; a prompt the server refuses as too long (`too_long`) ends its
session like --max-context does and is not an error.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(slots=True)
class RequestRecord:
    lane: int
    session: str  # draw-unique session id ("<trace id>#<draw>", sub-agents "<...>/<agent id>")
    depth: int  # 0: the agent, 1+: its sub-agents
    turn: int
    t_send: float  # seconds since the run began
    ttft: float | None
    e2e: float | None
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    sent_tokens: int  # prompt length the client built (token mode) or estimated (chat mode)
    target_tokens: int  # the trace's `in`, scaled
    max_tokens: int
    echoed: bool  # the output's token ids came back and stay in the agent's context
    error: str | None = None
    too_long: bool = False  # refused as longer than the server's context: ends its session (truncated)
    # the previous turn's prompt + output − 1 (its last token has no state) when this turn re-sent its
    # whole context (else None): cached tokens short of it mean the prompt left the cached path before
    # the frontier (or it was evicted)
    frontier: int | None = None
    tool_calls: int = 0  # chat: assistant tool calls in the messages sent
    tool_results: int = 0  # chat: tool messages sent

    @property
    def short_of_frontier(self) -> int:
        """Tokens of the previous turn's prompt + output this turn did not get from the cache."""
        return max(0, self.frontier - self.cached_tokens) if self.frontier is not None else 0

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class SessionRecord:
    lane: int
    session: str
    turns: int  # requests in the session, sub-agents included
    t_start: float
    t_end: float | None = None  # when its last request (or sub-agent) finished
    done: int = 0  # requests finished
    truncated: bool = False  # stopped early: a prompt would not fit --max-context
    failed: bool = False  # stopped early: a request failed

    @property
    def complete(self) -> bool:
        return self.t_end is not None and not self.failed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def agent_of(session: str) -> str:
    """The top-level session a request or session record belongs to ("<trace id>#<draw>", sub-agents'
    "<...>/<agent id>" under it)."""
    return session.split("/", 1)[0]


def percentiles(values: list[float], ps: tuple[int, ...] = (50, 90, 99)) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in ps}
    return {f"p{p}": float(v) for p, v in zip(ps, np.percentile(values, ps), strict=True)}


def _tokens_between(r: RequestRecord, a: float, b: float) -> float:
    """Output tokens of `r` streamed in [a, b), spread evenly over [first token, end]."""
    if r.error is not None or r.ttft is None or r.e2e is None:
        return 0.0
    t0, t1 = r.t_send + r.ttft, r.t_send + r.e2e
    if t1 <= t0:
        return float(r.output_tokens) if a <= t1 < b else 0.0
    return r.output_tokens * max(0.0, min(b, t1) - max(a, t0)) / (t1 - t0)


def output_timeline(records: list[RequestRecord], end: float, bucket_s: float) -> list[float]:
    """Output tokens per `bucket_s` seconds, from 0 to `end`."""
    n = max(1, math.ceil(end / bucket_s))
    return [sum(_tokens_between(r, i * bucket_s, (i + 1) * bucket_s) for r in records) for i in range(n)]


def summarize(
    requests: list[RequestRecord], sessions: list[SessionRecord], start: float, end: float, num_gpus: int = 1
) -> dict[str, Any]:
    """The run's numbers over the measured window [start, end)."""
    inside = [r for r in requests if start <= r.t_send < end]
    ok = [r for r in inside if r.error is None and r.e2e is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    minutes = max(end - start, 1e-9) / 60
    out_tokens = sum(_tokens_between(r, start, end) for r in requests)
    completed = [s for s in sessions if s.complete and s.t_start >= start and s.t_end <= end]
    done_ok = [r for r in requests if r.error is None and r.e2e is not None]
    return {
        "window_s": end - start,
        "requests": len(ok),
        "errors": sum(r.error is not None and not r.too_long for r in inside),
        "too_long": sum(r.too_long for r in inside),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "uncached_tokens": prompt - cached,
        "token_hit_rate": cached / prompt if prompt else None,
        "uncached_tokens_per_request": percentiles([r.uncached_tokens for r in ok], (50, 90)),
        "continuations": sum(r.frontier is not None for r in ok),
        "diverged_before_frontier": sum(r.short_of_frontier > 0 for r in ok),
        "tokens_short_of_frontier": sum(r.short_of_frontier for r in ok),
        "ttft_s": percentiles([r.ttft for r in ok if r.ttft is not None]),
        "e2e_s": percentiles([r.e2e for r in ok]),
        "output_tokens": round(out_tokens, 1),
        "output_tpm": out_tokens / minutes,
        "prefill_tpm_per_gpu": (prompt - cached) / minutes / num_gpus,
        "decode_tpm_per_gpu": out_tokens / minutes / num_gpus,
        "completed_agents": len(completed),
        "completed_agents_per_hour": len(completed) / minutes * 60,
        "turns_per_completed_agent": (float(np.mean([s.turns for s in completed])) if completed else None),
        "truncated_sessions": sum(s.truncated for s in sessions),
        "echoed_output_fraction": sum(r.echoed for r in ok) / len(ok) if ok else None,
        "prompt_vs_trace": sum(r.sent_tokens for r in ok) / max(1, sum(r.target_tokens for r in ok)),
        # Over the whole run (warm-up included): what the server's counters saw.
        "run_requests": len(done_ok),
        "run_prompt_tokens": sum(r.prompt_tokens for r in done_ok),
        "run_cached_tokens": sum(r.cached_tokens for r in done_ok),
        "run_output_tokens": sum(r.output_tokens for r in done_ok),
    }


# ---------------------------------------------------------------------------------------------------
# the server's /metrics (Prometheus text format)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """`name{labels}` → value, histogram buckets and `_created` samples left out."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if name.endswith(("_bucket", "_created")):
            continue
        try:
            out[name + labels] = float(value)
        except ValueError:
            continue
    return out


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after − before for every sample in both, and for a counter first seen after (a labelled counter
    appears at its first increment: it was 0 before)."""
    return {
        k: after[k] - before.get(k, 0.0)
        for k in after
        if k in before or k.split("{", 1)[0].endswith("_total")
    }


def server_sum(samples: dict[str, float], name: str, label: str = "") -> float | None:
    """Sum of a metric's samples over all label sets (`name` with or without `_total`), or over those whose
    labels hold `label` (e.g. 'call="load"'); None where there is none."""
    keys = [k for k in samples if k.split("{", 1)[0] in (name, name + "_total") and label in k]
    return sum(samples[k] for k in keys) if keys else None
