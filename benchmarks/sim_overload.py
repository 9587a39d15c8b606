"""Overload curves on the simulator (issue 34): N agents replaying the Claude-Code traces at full length
against one fixed cache budget, N from under to several times what the budget holds, every policy → token
hit rate, TTFT p50/p90, output TPM, completed agents, the longest queue wait and preemptions by kind.

    PYTHONPATH=. python benchmarks/sim_overload.py --traces /work/shared/traces/claude-code \
        --agents 48 128 256 512 --budget 60e9 --max-num-seqs 256 --duration 1200 \
        --out benchmarks/results/sim-overload-2026-12-02

Each run: the profile's served engine flags (default: the 2B preset's served H200 profile) with
--kv-cache-memory-bytes BUDGET --max-num-seqs S and the policy (flashstate: memory admission and preemption
into checkpoints on by default; vllm, sglang: their own schedulers), N lanes started over `--ramp` s,
`--warmup` s of warm-up, then `--duration` s measured (simulated time). Traces are read where they lie.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from sim_scale_study import one_run  # noqa: E402  (the same simulated run, at full length)

POLICIES = ("flashstate", "vllm", "sglang")
SERVED = "h200-qwen3-next-2b-served"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| agents | policy | token hit rate | TTFT p50 (s) | TTFT p90 (s) | requests | output TPM "
        "| completed agents | max queue wait (s) | preemptions recompute / checkpoint | CPU s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def num(v: float | None, fmt: str) -> str:
        return "–" if v is None else format(v, fmt)

    for r in sorted(rows, key=lambda r: (r["agents"], POLICIES.index(r["policy"]))):
        lines.append(
            f"| {r['agents']} | {r['policy']} | {num(r['hit_rate'], '.1%')} | {num(r['ttft_p50'], '.3g')} "
            f"| {num(r['ttft_p90'], '.3g')} | {r['requests']} | {num(r['output_tpm'], ',.0f')} "
            f"| {r['completed_agents']} | {num(r['max_queue_wait_s'], '.0f')} "
            f"| {r['preemptions_recompute']} / {r['preemptions_checkpoint']} | {r['cpu_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = (("hit_rate", "token hit rate (%)"), ("ttft_p90", "p90 TTFT (s)"), ("output_tpm", "output TPM"),
               ("completed_agents", "completed agents"))  # fmt: skip
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.8))
    for ax, (metric, label) in zip(axes, metrics, strict=True):
        for policy in POLICIES:
            pts = sorted(
                (r["agents"], r[metric]) for r in rows if r["policy"] == policy and r[metric] is not None
            )
            if pts:
                ys = [100 * v if metric == "hit_rate" else v for _, v in pts]
                ax.plot([n for n, _ in pts], ys, marker="o", label=policy)
        ax.set_xlabel("agents")
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = out / "overload.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", required=True, help="directory of the Claude-Code traces (read in place)")
    p.add_argument("--agents", type=int, nargs="+", default=[48, 128, 256, 512])
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--budget", type=float, default=60e9, help="KV + state bytes (--kv-cache-memory-bytes)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--profile", default=SERVED)
    p.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[], help="more engine flags (last)")
    p.add_argument("--warmup", type=float, default=0.0, help="simulated seconds before the window")
    p.add_argument("--duration", type=float, default=1200.0, help="simulated seconds measured")
    p.add_argument("--ramp", type=float, default=0.0, help="lane start stagger (simulated s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    common = {k: getattr(args, k) for k in ("budget", "max_num_seqs", "profile", "serve_args", "warmup",
                                             "duration", "ramp", "seed")}  # fmt: skip
    jobs = [
        common | {"traces": args.traces, "agents": n, "policy": policy}
        for n in args.agents
        for policy in args.policies
    ]
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(one_run, jobs):
            rows.append(row)
            print(table([row]).splitlines()[-1], file=sys.stderr, flush=True)
    meta = {"machine": platform.node(), "cpu": platform.processor(), "date": time.strftime("%Y-%m-%d"),
            "argv": sys.argv}  # fmt: skip
    (args.out / "overload.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (args.out / "table.md").write_text(table(rows))
    with contextlib.suppress(ImportError):  # matplotlib is optional
        print(plot(rows, args.out), file=sys.stderr)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
