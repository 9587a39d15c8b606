"""What the engine loop does between two steps, by what arrived during the first: for each recorded card run's
step trace, the loop's time after each step (the next step's `gap_ms`, sim/fit.py's with_gaps) against the
requests that reached the engine while that step ran (their count and prompt tokens: AsyncEngine drains them
from its inbox into LLMEngine.add before it steps again), fitted as gap = k + a · requests + b · tokens.

The simulator prices steps from their spans (`fit-profile`) and charges nothing between them, but for the
host tier's lookups (to the next step) and, in chat mode, the engine thread's share of a prompt's rendering
(`chat.engine_per_token_s`, to the step after its arrival): benchmarks/RESULTS.md, "The engine loop after
arrivals".

    R=benchmarks/results
    PYTHONPATH=. python benchmarks/engine_loop_gaps.py $R/card-2026-12-04/chat-17G-flashstate-host \\
        $R/card-2026-12-05/tune-0.5-plain-1

Prints a markdown table, a row per step trace.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from flashstate.sim.fit import holding_step, loop_share, read_request_lines, read_steps


def facts(steps: list[dict[str, Any]], requests: list[dict[str, Any]]) -> dict[str, float]:
    starts = [s["t"] for s in steps]
    arrived = np.zeros(len(steps))
    tokens = np.zeros(len(steps))
    for r in requests:
        i = holding_step(steps, starts, r["arrival"])
        if i >= 0:  # not in a gap
            arrived[i] += 1
            tokens[i] += r["prompt_tokens"]
    # the loop after step i is step i + 1's gap (0 where step i left nothing running or waiting); the last
    # step has none
    after = np.array([s["gap_ms"] for s in steps[1:]])
    arrived, tokens = arrived[:-1], tokens[:-1]
    x = np.stack([np.ones(len(after)), arrived, tokens / 1e4], axis=1)
    k, a, b = np.linalg.lstsq(x, after, rcond=None)[0]
    one, more = arrived == 1, arrived >= 2
    nan = float("nan")
    return {
        "steps": len(steps),
        "loop, % of spans": 100 * loop_share(steps),
        "after no arrival: mean (ms)": float(after[arrived == 0].mean()),
        "after one: mean (ms)": float(after[one].mean()) if one.any() else nan,
        "after two or more: mean (ms)": float(after[more].mean()) if more.any() else nan,
        "k (ms)": float(k),
        "a: per request (ms)": float(a),
        "b: per 10k tokens (ms)": float(b),
        "one arrival: corr(gap, tokens)": float(np.corrcoef(after[one], tokens[one])[0, 1])
        if one.sum() > 2
        else nan,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="card run directories (their steps-*.jsonl[.gz])")
    args = ap.parse_args(argv)
    rows = []
    for run in args.runs:
        for path in sorted(run.glob("steps-*.jsonl*")):
            steps = sorted((r for r in read_steps([path]) if "t" in r), key=lambda r: r["t"])
            requests = read_request_lines(path)
            if len(steps) < 20 or not requests:
                print(f"{path}: too few steps or no request lines", file=sys.stderr)
                continue
            rows.append((run.name, path.name, facts(steps, requests)))
    if not rows:
        return 1
    keys = list(rows[0][2])
    print("| run | trace | " + " | ".join(keys) + " |")
    print("|---|---|" + "---:|" * len(keys))
    for name, trace, f in rows:
        cells = [f"{f[k]:.0f}" if k == "steps" else f"{f[k]:.2f}" for k in keys]
        print(f"| {name} | {trace} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
