"""What a server's step trace (`--step-trace`) says about a run: how busy the engine was and what its
steps cost, split into pure-decode steps and steps with prefill tokens; and, from its request lines, where
the time to first token went."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flashstate.bench.files import read_text

# a step row's fields (`engine/step_trace.py` writes these and schedule_ms)
STEP_FIELDS = (
    "t", "ms", "prefill_tokens", "prefill_seqs", "decode_seqs", "running", "waiting", "prefill_pairs",
    "decode_context", "graphed", "exports", "host_ms",
)  # fmt: skip


def summarize_steps(path: Path) -> dict[str, Any] | None:
    """Summary of a step trace file; None when it is missing or has no steps."""
    if not path.exists():
        return None
    return summarize(*read_trace(path))


def summarize(steps: list[dict[str, Any]], requests: list[dict[str, Any]]) -> dict[str, Any] | None:
    """`summarize_rows` of the step rows, with where TTFT went (`ttft_parts` of the request rows)."""
    summary = summarize_rows(steps)
    if summary is not None:
        summary["ttft_parts"] = ttft_parts(requests)
    return summary


def read_trace(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(step rows, request rows) of a step trace file (gzipped where it ends in .gz)."""
    rows = [json.loads(line) for line in read_text(path).splitlines() if line.strip()]
    return [r for r in rows if "request" not in r], [r for r in rows if "request" in r]


def _quantiles(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    xs = sorted(xs)
    return {"mean": sum(xs) / len(xs), "p50": xs[len(xs) // 2], "p90": xs[int(0.9 * (len(xs) - 1))]}


def ttft_parts(requests: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Seconds from arrival to first token, in parts (request lines of a step trace): `queued` until admitted,
    `restoring` from the host tier until running, `to_first_step` until its first step ended, and
    `to_first_token` from there. None without request lines."""
    done = [r for r in requests if r.get("first_token") is not None and r.get("running") is not None]
    if not done:
        return None
    bounds = ("arrival", "admitted", "running", "first_scheduled", "first_token")
    parts = ("queued", "restoring", "to_first_step", "to_first_token")
    return {"requests": len(done)} | {
        part: _quantiles([r[b] - r[a] for r in done])
        for part, a, b in zip(parts, bounds[:-1], bounds[1:], strict=True)
    }


def summarize_rows(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Summary of step rows as `StepTrace` writes them (the simulator gives the same rows); None if none."""
    if not rows:
        return None
    mixed = [r for r in rows if r["prefill_tokens"]]
    decode = [r for r in rows if not r["prefill_tokens"] and r["decode_seqs"]]
    span = rows[-1]["t"] + rows[-1]["ms"] / 1e3 - rows[0]["t"]
    busy = sum(r["ms"] for r in rows) / 1e3
    mixed_s = sum(r["ms"] for r in mixed) / 1e3
    decode_s = sum(r["ms"] for r in decode) / 1e3
    prefilled = sum(r["prefill_tokens"] for r in mixed)

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "steps": len(rows),
        "span_s": span,
        "busy_fraction": busy / span if span > 0 else None,
        "prefill_steps": len(mixed),
        "prefill_step_ms_mean": mean([r["ms"] for r in mixed]),
        "prefill_tokens_per_step_mean": mean([r["prefill_tokens"] for r in mixed]),
        "prefill_tok_per_s_in_prefill_steps": prefilled / mixed_s if mixed_s else None,
        "decode_steps": len(decode),
        "decode_step_ms_mean": mean([r["ms"] for r in decode]),
        "decode_batch_mean": mean([r["decode_seqs"] for r in decode]),
        # the decode steps launched while the step before ran (async scheduling); None: not traced
        "decode_steps_ahead_fraction": mean([float(r["ahead"]) for r in decode])
        if "ahead" in rows[0]
        else None,
        "decode_seqs_in_prefill_steps_mean": mean([r["decode_seqs"] for r in mixed]),
        # the steps that replayed a captured CUDA graph; None: not traced
        "prefill_steps_graphed": sum(r["graphed"] for r in mixed) if "graphed" in rows[0] else None,
        "decode_steps_graphed": sum(r["graphed"] for r in decode) if "graphed" in rows[0] else None,
        "waiting_mean": mean([r["waiting"] for r in rows]),
        "seconds_in_prefill_steps": mixed_s,
        "seconds_in_decode_steps": decode_s,
        "seconds_scheduling": sum(r["schedule_ms"] for r in rows) / 1e3 if "schedule_ms" in rows[0] else None,
        # the engine thread's time inside the host tier; None: no tier (or not traced)
        "seconds_in_host_tier": sum(r["host_ms"] for r in rows) / 1e3 if "host_ms" in rows[0] else None,
    }
