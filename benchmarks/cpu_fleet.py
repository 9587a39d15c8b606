"""A fleet on the CPU: 2 replicas of the embedded tiny model behind vllm-router, 8 agents of the synthetic
workload replayed through the router, for round-robin vs cache-aware routing, each with and without one
shared Mooncake master (`flashstate fleet --shared-host-cache`); then cache-aware + Mooncake again with
the busier replica SIGKILLed a third of the way in and started again. Reports the token hit rate, uncached
tokens per request (p50), cross-replica restores (flashstate:host_cache_remote_restores, summed over the
replicas) and lost sessions.

    PYTHONPATH=. .venv/bin/python benchmarks/cpu_fleet.py --out out/cpu_fleet

Each variant starts a fresh fleet (fleet/launch.py); the replay is `flashstate bench`'s (bench/replay.py),
retrying requests a dying replica cut (ReplayConfig.retries). On a GPU, e.g. two replicas sharing one card
against one engine with all of it (the lead's H200 run):

    PYTHONPATH=. .venv/bin/python benchmarks/cpu_fleet.py --out out/gpu_fleet --agents 48 \
        --max-requests 2000 --length-scale 1 --max-output-tokens 256 --host-cache-bytes 64G \
        --variants "cache_aware" "cache_aware + mooncake" \
        --serve-args "MODEL_DIR --gpu-memory-utilization 0.45 --max-model-len 131072"
    ... --replicas 1 --variants "cache_aware" --serve-args "MODEL_DIR --gpu-memory-utilization 0.9 ..."
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx

from flashstate.bench import synthetic
from flashstate.bench.config import ReplayConfig
from flashstate.bench.cost import Prices
from flashstate.bench.metrics import parse_prometheus
from flashstate.bench.replay import replay
from flashstate.bench.report import build_result
from flashstate.bench.synthetic_defaults import DEFAULT as SYNTHETIC
from flashstate.fleet.launch import FleetSpec, running_fleet

SERVE = ("--device", "cpu", "--max-num-seqs", "4", "--max-model-len", "8192", "--host-chunk-tokens", "64",
         "--kv-cache-memory-bytes", "24M", "--prefill-cost-coefficients", "1e-5", "1e-10")  # fmt: skip
REMOTE_RESTORES = "flashstate:host_cache_remote_restores_total"
VARIANTS = {  # name: (router policy, shared Mooncake, kill a replica mid-run)
    "round_robin": ("round_robin", False, False),
    "round_robin + mooncake": ("round_robin", True, False),
    "cache_aware": ("cache_aware", False, False),
    "cache_aware + mooncake": ("cache_aware", True, False),
    "cache_aware + mooncake, a replica killed": ("cache_aware", True, True),
}


def counter(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(v for k, v in parse_prometheus(text).items() if k.split("{")[0] == name)


def served(url: str) -> float:
    return counter(url, "vllm:request_success_total")


def killer(fleet, after: int, done: threading.Event, log: list[str], lost: list[float]) -> threading.Thread:
    """Once the replicas have served `after` requests in all, SIGKILL the busier one (requests in flight on
    it), then start it again on its port."""

    def run() -> None:
        while not done.is_set():
            counts = [served(r.url) for r in fleet.replicas]
            busy = counter(fleet.replicas[counts.index(max(counts))].url, "vllm:num_requests_running")
            if sum(counts) >= after and busy:  # requests in flight on it die with it
                break
            time.sleep(0.2)
        else:
            return
        victim = fleet.replicas[counts.index(max(counts))]
        lost.append(counter(victim.url, REMOTE_RESTORES))  # the restart zeroes its counters
        victim.kill(signal.SIGKILL)
        log.append(f"replica {victim.index} SIGKILLed after {sum(counts):.0f} requests")
        fleet.restart_dead()
        log.append(f"replica {victim.index} started again and healthy")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/cpu_fleet"))
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--max-requests", type=int, default=96)
    ap.add_argument("--length-scale", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--serve-args", default=" ".join(SERVE), help="every replica's serve flags")
    ap.add_argument("--host-cache-bytes", default="256M", help="each replica's share of the Mooncake pool")
    ap.add_argument("--max-output-tokens", type=int, default=8)
    args = ap.parse_args()
    rows = []
    for name in args.variants:
        policy, shared, kill = VARIANTS[name]
        spec = FleetSpec(
            replicas=args.replicas, policy=policy, shared=shared, host_cache_bytes=args.host_cache_bytes,
            serve_args=tuple(args.serve_args.split()),
        )  # fmt: skip
        config = ReplayConfig(
            agents=args.agents, duration_s=1800, max_requests=args.max_requests,
            length_scale=args.length_scale, time_scale=0.0, max_output_tokens=args.max_output_tokens,
            retries=6, progress=False, seed=args.seed,
        )  # fmt: skip
        events: list[str] = []
        print(f"== {name}", file=sys.stderr, flush=True)
        with running_fleet(spec, args.out / name.replace(" ", "").replace(",", "-")) as fleet:
            config = replace(config, base_url=fleet.url)
            done = threading.Event()
            lost: list[float] = []
            t = killer(fleet, args.max_requests // 3, done, events, lost) if kill else None
            run = replay(config, synthetic.session_stream(SYNTHETIC, args.seed))
            done.set()
            if t is not None:
                t.join(600)
        result = build_result(run, name, {"kind": "synthetic"}, {}, Prices())
        s = result["summary"]
        delta = (result.get("server_metrics") or {}).get("delta") or {}
        remote = sum(v for k, v in delta.items() if k.startswith(REMOTE_RESTORES)) + sum(lost)
        rows.append({
            "variant": name,
            "requests": s["requests"],
            "hit_rate": s["token_hit_rate"],
            "uncached_p50": s["uncached_tokens_per_request"]["p50"],
            "remote_restores": remote,
            "errors_retried": s["errors"],
            "lost_sessions": sum(x.failed for x in run.sessions),
            "sessions_done": sum(x.complete for x in run.sessions),
            "events": events,
            "errors": sorted({r.error[:120] for r in run.requests if r.error}),
        })  # fmt: skip
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet.json").write_text(json.dumps(rows, indent=1))
    print("| routing | requests | token hit rate | uncached tokens / request p50 | cross-replica restores "
          "| failed attempts (retried) | lost sessions |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        hit = 100 * (r["hit_rate"] or 0)
        print(f"| {r['variant']} | {r['requests']} | {hit:.1f}% | {r['uncached_p50']:.0f} "
              f"| {r['remote_restores']:.0f} | {r['errors_retried']} | {r['lost_sessions']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
