"""Budget curves on the simulator (issues 9, 32): N agents replaying the real Claude-Code traces, cache
budgets stated as fractions of their working set, every policy → hit rate, uncached p50, TTFT, output TPM
and completed agents against the fraction; curves (one plot per metric) and a table.

    PYTHONPATH=. python benchmarks/sim_scale_study.py --agents 48 256 \
        --out benchmarks/results/sim-scale-2026-11-29
    # the headline's scale, one trace half (--trace-split tune|validate):
    PYTHONPATH=. python benchmarks/sim_scale_study.py --agents 48 --fractions 0.25 0.5 0.75 1 1.5 \
        --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 \
        --max-output-tokens 512 --warmup 15 --duration 270 --ramp 15 --trace-split tune --out DIR
    # the ablation at real size, each cache mechanism alone (asc-only: any-position checkpoints with LRU
    # eviction; gds-aligned: cost-aware eviction with block-aligned checkpoints), on a card run's flags:
    PYTHONPATH=. python benchmarks/sim_scale_study.py --agents 48 --fractions 0.1 0.15 0.25 0.5 \
        --policies asc-only gds-aligned flashstate flashstate-host --profile PROFILE.json \
        --serve-args '--max-num-batched-tokens 8192 --reserve-working-slots' --noise-seeds 5 \
        --max-context 262144 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512 \
        --warmup 240 --duration 240 --ramp 0 --drain 10 --out DIR

Working set W(N) (flashstate/bench/working_set.py, `flashstate bench working-set`) = N × (mean over trace
sessions of the peak prompt + output at the replay's scale, in KV bytes, + one recurrent state): what N
agents hold at once when each sits at its typical peak. Budget = fraction × W(N), passed as
--kv-cache-memory-bytes (it also holds the engine's max_num_seqs working states, as on the GPU).

Each run: N lanes, lanes started over `--ramp` s, `--warmup` s of warm-up, then `--duration` s measured
and `--drain` s for the window's unfinished requests (simulated); sessions are redrawn when one ends (a
repeated session gets fresh content). On a profile with step noise, `--noise-seeds K` runs each point at
noise seeds 0..K-1 and reports each figure's median (the seeds' range in the row's `spread`). Traces come
from FLASHSTATE_TRACES (default /work/shared/traces/claude-code) and are never copied.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from flashstate.bench.config import ReplayConfig
from flashstate.bench.cost import Prices
from flashstate.bench.report import build_result
from flashstate.bench.workloads import load_workload
from flashstate.sim.command import engine_config, simulate
from flashstate.sim.profile import NO_STEP_NOISE, load_profile
from flashstate.sim.working_set import working_set
from flashstate.spec.hf_config import spec_of

POLICIES = ("flashstate", "vllm", "sglang", "none")
# a variant: its cache policy and serve flags (--host-cache-bytes sets a host tier's size); asc-only and
# gds-aligned are the ablation's (headline.sh ablation): each of flashstate's two cache mechanisms alone
VARIANTS = {
    "flashstate-host": ("flashstate", ["--host-cache", "memory"]),
    "asc-only": ("flashstate", ["--prefix-cache-eviction", "lru"]),
    "gds-aligned": ("flashstate", ["--mamba-checkpoint-placement", "aligned"]),
}
NAMES = (*POLICIES, *VARIANTS)
# serve flags the study sets per run (the budget, the variants'), which --serve-args may not overrule
STUDY_FLAGS = {"--kv-cache-memory-bytes", "--host-cache-bytes"} | {
    f for _, flags in VARIANTS.values() for f in flags if f.startswith("--")
}
TRACES = os.environ.get("FLASHSTATE_TRACES", "/work/shared/traces/claude-code")
DRAIN_S = ReplayConfig().drain_s  # the replay's default

SCALE_KEYS = ("length_scale", "max_context", "time_scale", "max_think_s", "max_output_tokens")


FULL_LENGTH = {"length_scale": 1.0, "max_context": None, "time_scale": 1.0, "max_think_s": None,
               "max_output_tokens": None}  # fmt: skip


def serve_flags(job: dict[str, Any]) -> tuple[str, list[str]]:
    """A run's cache policy and serve flags: its engine's share of the budget, max_num_seqs, the variant's
    flags (a host tier's with its size and host_args), then serve_args."""
    flags = ["--kv-cache-memory-bytes", str(int(job["budget"]) // job.get("gpus", 1))]
    if job.get("max_num_seqs"):
        flags += ["--max-num-seqs", str(job["max_num_seqs"])]
    policy, variant_flags = VARIANTS.get(job["policy"], (job["policy"], []))
    if "--host-cache" in variant_flags:
        variant_flags = [*variant_flags, "--host-cache-bytes", str(job["host_cache_bytes"])]
        variant_flags += job.get("host_args", [])
    return policy, [*flags, *variant_flags, *job.get("serve_args", [])]


def one_run(job: dict[str, Any]) -> dict[str, Any]:
    """One simulated run. `job`: agents, budget, policy, profile, warmup, duration, ramp, seed; optional
    traces (default TRACES), split, scale (default full length), gpus, max_num_seqs, serve_args, drain."""
    traces = job.get("traces", TRACES)
    sessions = load_workload(traces, "auto", None, None, job.get("split"))
    profile = load_profile(job["profile"])
    gpus = job.get("gpus", 1)  # engines behind session-affinity routing, each with its share of the budget
    policy, flags = serve_flags(job)
    config = engine_config(profile, flags, policy)
    scale = job.get("scale", FULL_LENGTH)
    replay = ReplayConfig(
        base_url=f"sim://{profile.name}",
        agents=job["agents"],
        warmup_s=job["warmup"],
        duration_s=job["duration"],
        ramp_s=job["ramp"],
        drain_s=job.get("drain", DRAIN_S),
        seed=job["seed"],
        progress=False,
        num_gpus=gpus,
        **{k: scale[k] for k in SCALE_KEYS},
    )
    t0 = time.process_time()
    run, facts = simulate(profile, config, replay, sessions, noise_seed=job.get("noise_seed", 0))
    info = {"kind": "agentx", "source": traces, "sessions": len(sessions), "split": job.get("split"),
            "seed": job["seed"]}  # fmt: skip
    result = build_result(
        run, job["policy"], info, scale | {"length_scale_auto": False}, Prices(),
        {"cache_policy": job["policy"], "simulated": facts},
    )  # fmt: skip
    s, stats = result["summary"], facts["cache_stats"][0]
    return job | {
        "serve_flags": flags,
        "hit_rate": s["token_hit_rate"],
        "ttft_p50": s["ttft_s"]["p50"],
        "ttft_p90": s["ttft_s"]["p90"],
        "requests": s["requests"],
        "output_tpm": s["output_tpm"],
        "uncached_p50": s["uncached_tokens_per_request"]["p50"],
        "completed_agents": s["completed_agents"],
        "cache_plan": facts["cache_plan"],
        "evictions": stats["evictions"],
        "max_queue_wait_s": stats.get("max_queue_wait_s"),
        "preemptions_recompute": stats.get("preemptions_recompute"),
        "preemptions_checkpoint": stats.get("preemptions_checkpoint"),
        "cpu_s": time.process_time() - t0,
        **turn_split(result),
    }


# the figures a point reports as the median over its noise seeds
MEDIAN_KEYS = (
    "hit_rate",
    "ttft_p50",
    "ttft_p90",
    "output_tpm",
    "uncached_p50",
    "completed_agents",
    "requests",
)


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One point from its runs at several noise seeds: the first run's row with each of MEDIAN_KEYS the
    median over the runs (None where no run has it), its range in `spread`, the runs' CPU seconds summed."""
    row = dict(runs[0]) | {"noise_seeds": [r.get("noise_seed", 0) for r in runs], "spread": {}}
    for key in MEDIAN_KEYS:
        values = [r[key] for r in runs if r.get(key) is not None]
        row[key] = statistics.median(values) if values else None
        row["spread"][key] = [min(values), max(values)] if values else None
    row["cpu_s"] = sum(r["cpu_s"] for r in runs)
    return row


def turn_split(result: dict[str, Any]) -> dict[str, Any]:
    """The window's hit rate split by turn: first turns (turn 0 of a session or sub-agent: nothing of theirs
    was computed before, only a shared prefix can hit) and later turns; and `hit_ceiling`, the hit rate an
    unbounded cache would have given: each later turn's prompt served up to its previous turn's prompt +
    output − 1 (an upper bound: a turn that dropped part of its context gets less); `agents_served`, the
    lanes with a request sent and finished in the window, and `cut_requests`, those still unfinished when
    the drain ended (a starved lane's requests appear in neither the hit rate nor the TTFT)."""
    start, end = result["timeline"]["window"]
    done = {(r["session"], r["turn"]): r for r in result["requests"] if r["error"] is None}
    ok = [r for r in result["requests"] if start <= r["t_send"] < end]
    ok = [r for r in ok if r["error"] is None and r["e2e"] is not None]
    first = [r for r in ok if r["turn"] == 0]
    later = [r for r in ok if r["turn"] > 0]
    prompt = sum(r["prompt_tokens"] for r in ok)

    def rate(rs: list[dict[str, Any]]) -> float | None:
        p = sum(r["prompt_tokens"] for r in rs)
        return sum(r["cached_tokens"] for r in rs) / p if p else None

    reach = 0
    for r in later:
        prev = done.get((r["session"], r["turn"] - 1))
        if prev is not None:
            reach += min(prev["prompt_tokens"] + max(prev["output_tokens"] - 1, 0), r["prompt_tokens"])
    return {
        "first_turns": len(first),
        "first_turn_prompt_share": sum(r["prompt_tokens"] for r in first) / prompt if prompt else None,
        "hit_rate_first_turns": rate(first),
        "hit_rate_later_turns": rate(later),
        "hit_ceiling": reach / prompt if prompt else None,
        "agents_served": len({r["lane"] for r in ok}),
        "cut_requests": result["summary"]["cut_requests"],
    }


# the reference's Fig. 6: each metric against the budget, one line per policy (metric, axis label, log scale)
PLOTS = (
    ("hit_rate", "token hit rate (%)", False),
    ("uncached_p50", "uncached tokens / request, p50", True),
    ("ttft_p90", "p90 TTFT (s)", True),
    ("output_tpm", "output tokens / min", False),
    ("completed_agents", "completed agents", False),
)


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for metric, label, log in PLOTS:
        agents = sorted({r["agents"] for r in rows})
        fig, axes = plt.subplots(1, len(agents), figsize=(5 * len(agents), 3.8), squeeze=False)
        for ax, n in zip(axes[0], agents, strict=True):
            for policy in NAMES:
                pts = sorted(
                    (r["fraction"], r[metric]) for r in rows if r["agents"] == n and r["policy"] == policy
                )
                pts = [(f, v) for f, v in pts if v is not None]
                if pts:
                    ys = [100 * v if metric == "hit_rate" else v for _, v in pts]
                    ax.plot([100 * f for f, _ in pts], ys, marker="o", label=policy)
            ax.set_title(f"{n} agents")
            ax.set_xlabel("cache budget (% of working set)")
            ax.set_ylabel(label)
            if log:
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        paths.append(out / f"{metric}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| agents | engines | budget (% W) | budget | policy | token hit rate | uncached p50 | p50 TTFT (s) "
        "| p90 TTFT (s) | requests | output TPM | completed agents | CPU s |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["agents"], r["fraction"], NAMES.index(r["policy"]))):
        hit = "–" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
        p50 = "–" if r["ttft_p50"] is None else f"{r['ttft_p50']:.3g}"
        p90 = "–" if r["ttft_p90"] is None else f"{r['ttft_p90']:.3g}"
        reqs = "–" if r["requests"] is None else r["requests"]
        tpm = "–" if r["output_tpm"] is None else f"{r['output_tpm']:,.0f}"
        unc = "–" if r.get("uncached_p50") is None else f"{r['uncached_p50']:,.0f}"
        done = r.get("completed_agents", "–")
        lines.append(
            f"| {r['agents']} | {r.get('gpus', 1)} | {100 * r['fraction']:.0f}% | {r['budget'] / 1e9:.1f} GB "
            f"| {r['policy']} | "
            f"{hit} | {unc} | {p50} | {p90} | {reqs} | {tpm} | {done} | {r['cpu_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def save(out: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge `rows` into out/scale.json (runs for other agent counts, budgets or policies stay) and
    rewrite table.md; returns the merged rows."""
    path = out / "scale.json"
    if path.exists():
        new = {(r["agents"], r["fraction"], r["policy"]) for r in rows}
        old = json.loads(path.read_text())["rows"]
        rows = [r for r in old if (r["agents"], r["fraction"], r["policy"]) not in new] + rows
    path.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    (out / "table.md").write_text(table(rows))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, nargs="+", default=[48, 256])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0])
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=NAMES)
    p.add_argument("--host-cache-bytes", default=None, help="flashstate-host's host tier (default 64G)")
    p.add_argument(
        "--host-args", default="", help="more serve flags for flashstate-host, e.g. '--no-host-prefetch'"
    )
    p.add_argument("--profile", default=None)
    p.add_argument(
        "--serve-args",
        default="",
        help="serve flags for every run (after the budget's), e.g. a card run's "
        "'--max-num-seqs 48 --prefill-cost-coefficients A B'",
    )
    p.add_argument("--warmup", type=float, default=1800.0, help="simulated seconds before the window")
    p.add_argument("--duration", type=float, default=7200.0, help="simulated seconds measured")
    p.add_argument("--ramp", type=float, default=600.0, help="lane start stagger (simulated s)")
    p.add_argument(
        "--drain",
        type=float,
        default=DRAIN_S,
        help="simulated s the window's unfinished requests get after it (a card run's DRAIN)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--noise-seeds",
        type=int,
        default=1,
        help="noise seeds per point (a profile with step noise): medians",
    )
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    p.add_argument(
        "--agents-per-gpu", type=int, default=0, help="engines = ceil(agents / this); 0: one engine"
    )
    p.add_argument("--length-scale", type=float, default=1.0)
    p.add_argument("--max-context", type=int, default=None)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--max-think-time", type=float, default=None)
    p.add_argument("--max-output-tokens", type=int, default=None)
    p.add_argument("--trace-split", default=None, choices=["tune", "validate"])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/sim-scale-2026-11-29"))
    p.add_argument("--plot-only", action="store_true", help="redraw --out's plots and table (its scale.json)")
    args = p.parse_args()
    if args.plot_only:
        kept = ("--plot-only", "--out")
        if others := [a for a in sys.argv[1:] if a.startswith("--") and a.split("=")[0] not in kept]:
            p.error(f"--plot-only redraws a finished study: {', '.join(others)} would change nothing")
        rows = json.loads((args.out / "scale.json").read_text())["rows"]
        plot(rows, args.out)
        print(table(rows))
        return 0
    for flag, given in (
        ("--host-cache-bytes", args.host_cache_bytes is not None),
        ("--host-args", args.host_args),
    ):
        if given and "flashstate-host" not in args.policies:
            p.error(f"{flag} is flashstate-host's: add flashstate-host to --policies")
    serve_args = shlex.split(args.serve_args)
    if clash := sorted({a.split("=")[0] for a in serve_args} & STUDY_FLAGS):
        p.error(
            f"--serve-args: {', '.join(clash)} would overrule what --fractions, --policies or "
            "--host-cache-bytes set for each run"
        )
    scale = {
        "length_scale": args.length_scale,
        "max_context": args.max_context,
        "time_scale": args.time_scale,
        "max_think_s": args.max_think_time,
        "max_output_tokens": args.max_output_tokens,
    }
    sessions = load_workload(TRACES, "auto", None, None, args.trace_split)
    profile = load_profile(args.profile)
    spec, dtype = spec_of(profile.model), getattr(torch, profile.dtype)
    jobs = []
    for n in args.agents:
        ws = working_set(
            sessions, n, spec, dtype, args.length_scale, args.max_context, args.max_output_tokens
        )
        w = ws.bytes
        print(
            f"{n} agents: working set {w / 1e9:.1f} GB (mean session peak {ws.mean_peak_tokens:,.0f} tokens)",
            file=sys.stderr,
        )
        for f in args.fractions:
            for policy in args.policies:
                jobs.append(
                    {
                        "agents": n,
                        "fraction": f,
                        "budget": int(f * w),
                        "working_set": w,
                        "policy": policy,
                        "host_cache_bytes": args.host_cache_bytes or "64G",
                        "host_args": shlex.split(args.host_args),
                        "serve_args": serve_args,
                        "profile": args.profile,
                        "warmup": args.warmup,
                        "duration": args.duration,
                        "ramp": args.ramp,
                        "drain": args.drain,
                        "seed": args.seed,
                        "scale": scale,
                        "split": args.trace_split,
                        "gpus": -(-n // args.agents_per_gpu) if args.agents_per_gpu else 1,
                        "noise_seed": 0,
                    }
                )
    if args.noise_seeds < 1:
        p.error("--noise-seeds: at least 1")
    if args.noise_seeds > 1 and profile.noise == NO_STEP_NOISE:
        p.error(f"--noise-seeds: profile {profile.name} has no step noise (its runs would be alike)")
    jobs = [j | {"noise_seed": k} for j in jobs for k in range(args.noise_seeds)]  # a point's seeds in a row
    jobs.sort(key=lambda j: -j["agents"])  # the long runs first
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    merged: list[dict[str, Any]] = []
    t0 = time.time()
    run = {
        "command": " ".join(sys.argv),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "traces": TRACES,
    }
    seeds: list[dict[str, Any]] = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for one in pool.map(one_run, jobs):
            seeds.append(one)
            if len(seeds) < args.noise_seeds:
                continue
            row, seeds = median_row(seeds), []
            row["invocation"] = run | {"wall_s": time.time() - t0}
            rows.append(row)
            print(
                f"{row['agents']} agents {row['fraction']:.0%} {row['policy']}: hit {row['hit_rate']}, "
                f"p90 TTFT {row['ttft_p90']}, {row['cpu_s']:.0f} s CPU",
                file=sys.stderr,
            )
            merged = save(args.out, rows)  # after every point: an interrupted study keeps what finished
    plot(merged, args.out)
    print(table(merged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
