"""`flashstate` command line: serve (the OpenAI-compatible server), calibrate, bench, demo, simulate,
fit-profile (a simulator profile from measured steps), working-set (the cache bytes agents replaying a
trace set hold), mooncake-master (a Mooncake store master for
the host tier), and fleet (replicas behind a router)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from flashstate import __version__, envs
from flashstate.args import add_cache_args, add_engine_args, add_server_args, config_from_args
from flashstate.config import EngineConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashstate", description=__doc__)
    parser.add_argument("--version", action="version", version=f"flashstate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible HTTP server",
        description="OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /health, "
        "/version, /metrics). Flags are named like `vllm serve`'s where the meaning is the same.",
    )
    serve.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL_DIR",
        help="HF-format model directory (same as --model; default: the embedded tiny model)",
    )
    add_engine_args(serve)
    add_cache_args(serve)
    add_server_args(serve)
    calibrate = sub.add_parser(
        "calibrate",
        help="measure the prefill cost C(n) = a·n + b·n² on this model and device, and cache the fit",
        description="Times from-scratch prefills of several lengths (chunked like the scheduler), fits "
        "a and b, prints them and stores the fit where the engine looks for it at start-up.",
    )
    add_engine_args(calibrate)
    add_cache_args(calibrate)
    calibrate.add_argument("--max-tokens", type=int, default=None, help="longest prefill timed")
    _add_bench(sub)
    master = sub.add_parser(
        "mooncake-master",
        help="run a Mooncake store master for --host-cache mooncake (single node: on loopback)",
        description="Starts `mooncake_master` in the foreground (no built-in metadata server: clients use "
        "P2P handshakes). Engines join with --host-cache mooncake --mooncake-master HOST:PORT.",
    )
    master.add_argument("--host", default="127.0.0.1", help="address the master listens on")
    master.add_argument("--port", type=int, default=50051, help="RPC port (--mooncake-master HOST:PORT)")
    master.add_argument("--metrics-port", type=int, default=9003, help="the master's HTTP metrics port")
    from flashstate.fleet.command import add_fleet_parser

    add_fleet_parser(sub)
    return parser


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from flashstate.bench.cli_args import add_bench_parser, add_demo_parser
    from flashstate.sim.cli_args import add_fit_profile_parser, add_simulate_parser
    from flashstate.sim.working_set import add_working_set_parser

    add_bench_parser(sub)
    add_demo_parser(sub)
    add_simulate_parser(sub)
    add_fit_profile_parser(sub)
    add_working_set_parser(sub)


def _resolve(args: argparse.Namespace) -> EngineConfig:
    if getattr(args, "model_tag", None) is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(f"two models given: {args.model_tag!r} and --model {args.model!r}")
        args.model = args.model_tag
    if args.command == "serve" and args.api_key is None:
        key = envs.FLASHSTATE_API_KEY or envs.VLLM_API_KEY
        args.api_key = key
    return config_from_args(args)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "mooncake-master":
        return _mooncake_master(args.host, args.port, args.metrics_port)
    if args.command == "fleet":
        from flashstate.fleet.command import run_fleet

        return run_fleet(args)
    if args.command in ("bench", "demo"):
        from flashstate.bench.command import run_bench

        return run_bench(args)
    if args.command == "simulate":
        from flashstate.sim.command import run_simulate

        return run_simulate(args)
    if args.command == "fit-profile":
        from flashstate.sim.command import run_fit_profile

        return run_fit_profile(args)
    if args.command == "working-set":
        from flashstate.sim.working_set import run_working_set

        return run_working_set(args)
    try:
        config = _resolve(args)
    except ValueError as e:
        print(f"flashstate: error: {e}", file=sys.stderr)
        return 2
    if args.command == "calibrate":
        return _calibrate(config, args.max_tokens)
    if args.command == "serve":
        from flashstate.server.app import serve

        try:
            return serve(config)
        except (ValueError, FileNotFoundError, OSError) as e:
            print(f"flashstate: error: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # Ctrl-C before the server took over the signal (loading the model)
            print("flashstate: interrupted", file=sys.stderr, flush=True)
            sys.stdout.flush()
            # the engine thread may be inside native code (loading, compiling): tearing the interpreter down
            # under it aborts the process (SIGABRT), so leave without the teardown
            os._exit(130)
    return 0


def _mooncake_master(host: str, port: int, metrics_port: int) -> int:
    from flashstate.cache.host.mooncake import start_master

    try:
        master = start_master(port, metrics_port, host, quiet=False)
    except (RuntimeError, FileNotFoundError) as e:
        print(f"flashstate: error: {e}", file=sys.stderr)
        return 1
    print(
        f"mooncake_master on {master.address}: serve with --host-cache mooncake "
        f"--mooncake-master {master.address}",
        flush=True,
    )
    import signal

    stopping = []

    def on_sigterm(*_: object) -> None:
        stopping.append(1)
        master.process.send_signal(signal.SIGCONT)  # a stopped master would keep a SIGTERM pending
        master.process.terminate()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        rc = master.process.wait()
    except KeyboardInterrupt:
        master.stop()
        return 0
    return 0 if stopping else rc


def _calibrate(config: EngineConfig, max_tokens: int | None) -> int:
    from dataclasses import replace

    from flashstate.engine import calibration
    from flashstate.engine.llm_engine import LLMEngine

    try:
        engine = LLMEngine(replace(config, enable_prefix_caching=False))
    except (ValueError, FileNotFoundError) as e:
        print(f"flashstate: error: {e}", file=sys.stderr)
        return 2
    cache_tokens = engine.plan.num_blocks * config.block_size
    limit = calibration.max_calibration_tokens(
        engine.device, engine.max_model_len, cache_tokens, max_tokens or 32768
    )
    runner = engine.runner
    cost, detail = calibration.calibrate(
        engine.model, runner.caches, config.block_size, config.max_num_batched_tokens, limit, engine.device
    )
    path = calibration.cache_path(
        engine.model, engine.device, config.max_num_batched_tokens, config.calibration_cache_dir
    )
    saved = calibration.save(path, cost, detail, engine.device)
    print("| tokens | measured (s) | fit (s) |\n|---|---|---|")
    for n, t in zip(detail["lengths"], detail["seconds"], strict=True):
        print(f"| {n} | {t:.4f} | {cost(n):.4f} |")
    if detail.get("launch_bound"):
        print(f"left out of the fit, launch-bound (as long as the shortest): {detail['launch_bound']} tokens")
    where = calibration.device_name(engine.device)
    if not saved:
        print(f"calibration rejected ({detail.get('rejected', cost.kind)}): nothing saved; run it when idle")
        return 1
    print(f"C(n) = {cost.a:.4g}·n + {cost.b:.4g}·n²  ({where}; saved to {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
