"""Does a request's time outside the engine grow with the requests prepared beside it? For each recorded card
run: its client records paired with its server's request lines (sim/fit.py's pair_requests), the time each
spent outside the engine (client TTFT less the server's arrival to first token) less the profile's price
for it alone (overhead_s + overhead_per_token_s · prompt tokens, the run's mode's terms), and that residual's
correlation with the delay two models of a crowded server add to the per-token part, at the run's send times:

- shared: the prompts in preparation share one CPU (sim/shared_cpu.py, as a chat replay runs them);
- queued: they are prepared one at a time, in send order.

    R=benchmarks/results
    PYTHONPATH=. python benchmarks/overhead_sharing.py $R/card-2026-12-04/chat-17G-flashstate-host \\
        $R/card-2026-12-05/tune-0.5-plain-1 --profile h200-qwen3-next-2b-tune

Prints a markdown table (a row per run and label).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from flashstate.bench.report import read_result, result_files
from flashstate.sim.events import EventLoop
from flashstate.sim.fit import outside_engine_s, pair_requests, read_request_lines
from flashstate.sim.profile import RequestOverhead, load_profile
from flashstate.sim.shared_cpu import SharedCPU


def shared_delay(sends: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Each item's finish on a SharedCPU less its send and its own work."""
    loop, finished = EventLoop(), np.zeros(len(sends))
    cpu = SharedCPU(loop)
    for i in np.argsort(sends, kind="stable"):
        loop.at(
            float(sends[i]),
            lambda i=i: cpu.submit(float(work[i]), lambda i=i: finished.__setitem__(i, loop.now)),
        )
    loop.run(lambda: None)
    return finished - sends - work


def queued_delay(sends: np.ndarray, work: np.ndarray) -> np.ndarray:
    delay, free = np.zeros(len(sends)), -np.inf
    for i in np.argsort(sends, kind="stable"):
        start = max(sends[i], free)
        delay[i], free = start - sends[i], start + work[i]
    return delay


def facts(pairs: list[tuple[dict[str, Any], dict[str, Any]]], price: RequestOverhead) -> dict[str, float]:
    tokens = np.array([c["prompt_tokens"] for c, _ in pairs], dtype=float)
    sends = np.array([c["t_send"] for c, _ in pairs])
    residual = np.array([outside_engine_s(p) for p in pairs]) - (price.base_s + price.per_token_s * tokens)
    work = price.per_token_s * tokens
    shared, queued = shared_delay(sends, work), queued_delay(sends, work)
    return {
        "pairs": len(pairs),
        "residual p50 (ms)": 1e3 * float(np.median(residual)),
        "residual p90 (ms)": 1e3 * float(np.percentile(residual, 90)),
        "shared: delay p90 (ms)": 1e3 * float(np.percentile(shared, 90)),
        "shared: correlation": float(np.corrcoef(shared, residual)[0, 1]),
        "queued: delay p90 (ms)": 1e3 * float(np.percentile(queued, 90)),
        "queued: correlation": float(np.corrcoef(queued, residual)[0, 1]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="card run directories (result + steps files)")
    ap.add_argument("--profile", required=True, help="a shipped profile's name or a profile file")
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    rows = []
    for run in args.runs:
        for path in result_files(run):
            result = read_result(path)
            label = result["label"]
            steps = next(run.glob(f"steps-{label}.jsonl*"), None)  # as sim_vs_card.py finds it
            if steps is None:
                print(f"{run}: no step trace for {label}", file=sys.stderr)
                continue
            mode = result["replay"].get("mode", "completions")
            pairs = pair_requests(read_request_lines(steps), result["requests"])
            if len(pairs) < 20:
                print(f"{run}: {label}: only {len(pairs)} requests pair up", file=sys.stderr)
                continue
            rows.append((run.name, label, mode, facts(pairs, profile.request_overhead_for(mode))))
    if not rows:
        return 1
    keys = list(rows[0][3])
    print("| run | label | mode | " + " | ".join(keys) + " |")
    print("|---|---|---|" + "---:|" * len(keys))
    for name, label, mode, f in rows:
        cells = [
            f"{f[k]:.0f}" if k == "pairs" else f"{f[k]:.2f}" if "correlation" in k else f"{f[k]:.1f}"
            for k in keys
        ]
        print(f"| {name} | {label} | {mode} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
