"""Overload curves on the simulator (issue 34): N agents replaying the Claude-Code traces at full length
against one fixed cache budget, N from under to several times what the budget holds, every policy → token
hit rate, TTFT p50/p90, output TPM, completed agents, the longest queue wait and preemptions by kind.

    PYTHONPATH=. python benchmarks/sim_overload.py --traces /work/shared/traces/claude-code \
        --agents 48 128 256 512 --budget 60e9 --max-num-seqs 256 --duration 1200 \
        --out benchmarks/results/sim-overload-2026-12-02
    # the admission knobs on one trace half (flashstate runs every combination; vllm and sglang, which
    # have no memory admission, run once):
    PYTHONPATH=. python benchmarks/sim_overload.py --traces /work/shared/traces/claude-code --agents 256 \
        --trace-split tune --policies flashstate --max-queue-wait 300 900 1800 --cache-reserve 0.1 0.25 0.4 \
        --cold-reserve 0 0.55 --expected-output 1024 2048 --out DIR

Each run: the profile's served engine flags (default: the 2B preset's served H200 profile) with
--kv-cache-memory-bytes BUDGET --max-num-seqs S and the policy (flashstate: memory admission and preemption
into checkpoints on by default; vllm, sglang: their own schedulers), N lanes started over `--ramp` s,
`--warmup` s of warm-up, then `--duration` s measured (simulated time). Traces are read where they lie;
`--trace-split tune|validate` keeps the even / odd sessions by file name (knobs set on one half are checked
on the other). Besides the run's hit rate, each row splits it by turn: the prompt share and hit rate of first
turns (turn 0 of a session or sub-agent: only a shared prefix can hit) and of later turns, and the
hit rate an unbounded cache would have given the same requests (each later turn served up to its previous
turn's prompt + output; an upper bound).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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
KNOBS = (  # memory admission's knobs (flashstate only): column, engine flag
    ("max_queue_wait", "--max-queue-wait-seconds"),
    ("cache_reserve", "--admission-cache-reserve"),
    ("cold_reserve", "--admission-cold-reserve"),
    ("expected_output", "--admission-expected-output-tokens"),
)


def knob_text(r: dict[str, Any]) -> str:
    """The admission knobs a row ran with ("defaults": none set; "–": not the flashstate policy)."""
    if r["policy"] != "flashstate":
        return "–"
    set_ = [f"{r[k]:g}" if r.get(k) is not None else "·" for k, _ in KNOBS]
    return " / ".join(set_) if any(r.get(k) is not None for k, _ in KNOBS) else "defaults"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| split | agents | policy | wait / reserve / cold / out | token hit rate | unbounded-cache ceiling "
        "| first-turn share "
        "| later-turn hit rate | TTFT p50 (s) | TTFT p90 (s) | requests | cut | agents served | output TPM "
        "| completed agents "
        "| max queue wait (s) | preemptions recompute / checkpoint | CPU s |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def num(v: float | None, fmt: str) -> str:
        return "–" if v is None else format(v, fmt)

    def key(r: dict[str, Any]) -> tuple:
        return (r.get("split") or "", r["agents"], POLICIES.index(r["policy"]), knob_text(r))

    for r in sorted(rows, key=key):
        lines.append(
            f"| {r.get('split') or 'all'} | {r['agents']} | {r['policy']} | {knob_text(r)} "
            f"| {num(r['hit_rate'], '.1%')} | {num(r.get('hit_ceiling'), '.1%')} "
            f"| {num(r.get('first_turn_prompt_share'), '.0%')} "
            f"| {num(r.get('hit_rate_later_turns'), '.1%')} | {num(r['ttft_p50'], '.3g')} "
            f"| {num(r['ttft_p90'], '.3g')} | {r['requests']} | {r.get('cut_requests', '–')} "
            f"| {r.get('agents_served', '–')} | {num(r['output_tpm'], ',.0f')} "
            f"| {r['completed_agents']} | {num(r['max_queue_wait_s'], '.0f')} "
            f"| {r['preemptions_recompute']} / {r['preemptions_checkpoint']} | {r['cpu_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], out: Path, tag: str) -> Path:
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
    path = out / f"{tag}.png"
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
    p.add_argument("--trace-split", default=None, choices=["tune", "validate"], help="one half of the traces")
    p.add_argument("--max-queue-wait", type=float, nargs="+", default=[None], help="flashstate: s (grid)")
    p.add_argument("--cache-reserve", type=float, nargs="+", default=[None], help="flashstate: share (grid)")
    p.add_argument("--cold-reserve", type=float, nargs="+", default=[None], help="flashstate: share (grid)")
    p.add_argument("--expected-output", type=int, nargs="+", default=[None], help="flashstate: tokens (grid)")
    p.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[], help="more engine flags (last)")
    p.add_argument("--warmup", type=float, default=0.0, help="simulated seconds before the window")
    p.add_argument("--duration", type=float, default=1200.0, help="simulated seconds measured")
    p.add_argument("--ramp", type=float, default=0.0, help="lane start stagger (simulated s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tag", default=None, help="file names in --out (default overload-<split or all>)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    common = {k: getattr(args, k) for k in ("budget", "max_num_seqs", "profile", "serve_args", "warmup",
                                             "duration", "ramp", "seed")}  # fmt: skip
    common["split"] = args.trace_split
    grid = list(
        itertools.product(args.max_queue_wait, args.cache_reserve, args.cold_reserve, args.expected_output)
    )
    jobs = []
    for n in args.agents:
        for policy in args.policies:
            for values in grid if policy == "flashstate" else [(None,) * len(KNOBS)]:
                flags = [x for (_, flag), v in zip(KNOBS, values, strict=True) if v is not None
                         for x in (flag, f"{v:g}")]  # fmt: skip
                jobs.append(
                    common
                    | {"traces": args.traces, "agents": n, "policy": policy}
                    | dict(zip((k for k, _ in KNOBS), values, strict=True))
                    | {"serve_args": flags + list(args.serve_args)}
                )
    tag = args.tag or f"overload-{args.trace_split or 'all'}"
    meta = {"machine": platform.node(), "cpu": platform.processor(), "date": time.strftime("%Y-%m-%d"),
            "argv": sys.argv}  # fmt: skip
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(one_run, jobs):
            rows.append(row)
            print(table([row]).splitlines()[-1], file=sys.stderr, flush=True)
            # after every run: an interrupted grid keeps what finished
            (args.out / f"{tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
            (args.out / f"{tag}.md").write_text(table(rows))
    if len(grid) == 1:  # the curves: one flashstate configuration
        with contextlib.suppress(ImportError):  # matplotlib is optional
            print(plot(rows, args.out, tag), file=sys.stderr)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
