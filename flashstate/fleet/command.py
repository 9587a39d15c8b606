"""`flashstate fleet [fleet flags] -- [serve flags]`: start a fleet (launch.py), print the router's URL,
keep it up (a replica that exits is started again) until SIGTERM, SIGHUP or Ctrl-C stops every part."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from flashstate.fleet.launch import FleetSpec, running_fleet
from flashstate.fleet.router import POLICIES
from flashstate.lifeline import Terminated, terminate_on_signals

SUPERVISE_S = 1.0  # how often dead replicas are looked for


def add_fleet_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fleet",
        help="N serve replicas behind vllm-router, optionally sharing states through one Mooncake master",
        description="Starts [a mooncake_master,] N `flashstate serve` replicas and vllm-router on this "
        "host, prints the router's URL, and stops them all on SIGTERM or Ctrl-C. Flags after `--` go to "
        "every replica (e.g. `-- --max-model-len 32768`). See docs/deployment.md.",
    )
    p.add_argument("--replicas", type=int, default=2, help="number of serve replicas (default: 2)")
    p.add_argument(
        "--policy", choices=POLICIES, default="cache_aware", help="the router's (default: cache_aware)"
    )
    p.add_argument(
        "--shared-host-cache",
        action="store_true",
        help="start a Mooncake master; every replica's host tier on it (--host-cache mooncake), so a "
        "replica restores states another one wrote",
    )
    p.add_argument("--host-cache-bytes", default="1G", help="each replica's share of the Mooncake pool")
    p.add_argument("--cache-policy", default="flashstate", help="the replicas' --cache-policy")
    p.add_argument("--host", default="127.0.0.1", help="address the router listens on")
    p.add_argument("--port", type=int, default=8000, help="the router's port (default: 8000)")
    p.add_argument("--out", type=Path, default=Path("fleet-logs"), help="where the logs go")
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then flags for every replica")


def run_fleet(args: argparse.Namespace) -> int:
    serve = list(args.serve_args)
    if serve[:1] == ["--"]:
        serve = serve[1:]
    try:
        spec = FleetSpec(
            replicas=args.replicas,
            policy=args.policy,
            shared=args.shared_host_cache,
            host_cache_bytes=args.host_cache_bytes,
            cache_policy=args.cache_policy,
            serve_args=tuple(serve),
            host=args.host,
            port=args.port,
        )
    except ValueError as e:
        print(f"flashstate: error: {e}", file=sys.stderr)
        return 2
    try:
        with terminate_on_signals(), running_fleet(spec, args.out) as fleet:
            parts = ", ".join(r.url for r in fleet.replicas)
            master = f"; mooncake master {fleet.master.address}" if fleet.master else ""
            print(
                f"fleet: router {fleet.url} ({spec.policy}) → {parts}{master}; logs in {args.out}", flush=True
            )
            while fleet.router.poll() is None:
                for i in fleet.restart_dead():
                    print(f"fleet: replica {i} had exited: started again", flush=True)
                time.sleep(SUPERVISE_S)
            print(f"fleet: the router exited with status {fleet.router.returncode}", file=sys.stderr)
            return 1
    except (Terminated, KeyboardInterrupt):
        return 0
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        print(f"flashstate: error: {e}", file=sys.stderr)
        return 1
