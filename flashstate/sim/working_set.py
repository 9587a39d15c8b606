"""The agents' working set: the cache bytes N agents replaying a trace set hold at once, so that a budget
is named by its fraction of it (chosen before a run), never by where a baseline lands.

    W(N) = N × mean over sessions (peak context × attention bytes per token + one recurrent state)

A session's peak context is its largest prompt + output at the replay's scale (`length_scale`, the
output cap) among the turns before the first one that would pass `max_context` (the replay ends a
session there). Sub-agents are not counted (they come and go within a turn). `flashstate working-set`
prints W and the `--kv-cache-memory-bytes` of each fraction. (In sim/, not bench/: bench is an HTTP client
and reads no model or cache layout.)"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch

from flashstate.bench.prompts import scaled
from flashstate.bench.workloads import Session, load_workload
from flashstate.cache.cache_tensors import kv_bytes_per_block, kv_dtype, state_bytes_per_slot
from flashstate.spec.hf_config import spec_of
from flashstate.spec.model_spec import ModelSpec

DEFAULT_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.5)


@dataclass(frozen=True, slots=True)
class WorkingSet:
    agents: int
    sessions: int
    mean_peak_tokens: float
    kv_bytes_per_token: int
    state_bytes: int

    @property
    def bytes(self) -> int:
        return int(self.agents * (self.mean_peak_tokens * self.kv_bytes_per_token + self.state_bytes))

    def budget(self, fraction: float) -> int:
        return int(fraction * self.bytes)


def session_peak(
    session: Session, length_scale: float, max_context: int | None, max_output_tokens: int | None
) -> int:
    peak = 0
    for r in session.requests:
        out = scaled(r.output_len, length_scale)
        if max_output_tokens is not None:
            out = min(out, max_output_tokens)
        n = scaled(r.input_len, length_scale) + out
        if max_context is not None and n > max_context:
            break  # the replay ends the session here
        peak = max(peak, n)
    return peak


def working_set(
    sessions: list[Session],
    agents: int,
    spec: ModelSpec,
    dtype: torch.dtype,
    length_scale: float = 1.0,
    max_context: int | None = None,
    max_output_tokens: int | None = None,
    kv_cache_dtype: str = "auto",
) -> WorkingSet:
    if not sessions:
        raise ValueError("no sessions to take a working set of")
    peaks = [session_peak(s, length_scale, max_context, max_output_tokens) for s in sessions]
    return WorkingSet(
        agents=agents,
        sessions=len(sessions),
        mean_peak_tokens=sum(peaks) / len(peaks),
        kv_bytes_per_token=kv_bytes_per_block(spec, 1, kv_dtype(kv_cache_dtype, dtype)),
        state_bytes=state_bytes_per_slot(spec, dtype),
    )


def add_working_set_parser(sub: argparse._SubParsersAction) -> None:
    ws = sub.add_parser(
        "working-set",
        help="the cache bytes N agents replaying a trace set hold, and the budgets at fractions of it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ws.add_argument("path", help="trace file or directory")
    ws.add_argument("--model", default="qwen3-next-2b", help="preset name or HF model directory")
    ws.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ws.add_argument("--kv-cache-dtype", default="auto", help="as `flashstate serve --kv-cache-dtype`")
    ws.add_argument("--agents", type=int, default=48)
    ws.add_argument("--length-scale", type=float, default=1.0)
    ws.add_argument("--max-context", type=int, default=None)
    ws.add_argument("--max-output-tokens", type=int, default=None)
    ws.add_argument("--fractions", type=float, nargs="+", default=list(DEFAULT_FRACTIONS))
    ws.add_argument("--trace-format", default="auto", choices=["auto", "agentx", "mooncake"])
    ws.add_argument("--trace-split", default=None, choices=["tune", "validate"])


def run_working_set(args: argparse.Namespace) -> int:
    try:
        return _print_working_set(args)
    except (ValueError, OSError) as e:  # WorkloadError is a ValueError
        print(f"flashstate working-set: error: {e}", file=sys.stderr)
        return 2


def _print_working_set(args: argparse.Namespace) -> int:
    sessions = load_workload(args.path, args.trace_format, split=args.trace_split)
    w = working_set(
        sessions,
        args.agents,
        spec_of(args.model),
        getattr(torch, args.dtype),
        args.length_scale,
        args.max_context,
        args.max_output_tokens,
        args.kv_cache_dtype,
    )
    doc = {
        "agents": w.agents,
        "sessions": w.sessions,
        "split": args.trace_split,
        "mean_peak_tokens": round(w.mean_peak_tokens, 1),
        "kv_bytes_per_token": w.kv_bytes_per_token,
        "state_bytes": w.state_bytes,
        "working_set_bytes": w.bytes,
        "budgets": {f"{f:g}": w.budget(f) for f in args.fractions},
    }
    print(json.dumps(doc, indent=1))
    return 0
