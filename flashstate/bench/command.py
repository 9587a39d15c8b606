"""`flashstate bench run | compare | stats`: flags → workload, ReplayConfig, prices; results written to
`--out` (result JSON, report.md, PNGs) and the table printed.

    flashstate bench run --url http://127.0.0.1:8000 --agents 8 --duration 300
    flashstate bench compare --policies flashstate,vllm --serve-args "--kv-cache-memory-bytes 64M" \\
        --length-scale 0.02 --time-scale 0.05 --agents 4 --duration 60 --out benchmarks/demo
    flashstate bench stats ../shared/traces/claude-code
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from flashstate.bench import synthetic
from flashstate.bench.cost import Prices
from flashstate.bench.prompts import auto_length_scale
from flashstate.bench.replay import MODES, ReplayConfig, replay
from flashstate.bench.report import build_result, markdown, write_report
from flashstate.bench.workloads import Session, WorkloadError, load_workload, trace_format
from flashstate.config import CACHE_POLICIES

Workload = Callable[[], list[Session] | Iterator[Session]]


def _workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument(
        "--workload",
        default="synthetic",
        help="'synthetic' (the generator fitted to Claude-Code traces) or a trace file/directory",
    )
    g.add_argument(
        "--trace-format",
        default="auto",
        choices=["auto", "agentx", "mooncake"],
        help="trace format (auto: .jsonl is Mooncake, .json/.json.gz AgentX)",
    )
    g.add_argument(
        "--trace-block-size",
        type=int,
        default=None,
        help="tokens per hash block of a Mooncake trace (default 512; AgentX files carry theirs)",
    )
    g.add_argument("--trace-limit", type=int, default=None, help="load at most this many trace files")
    g.add_argument(
        "--subagent-prob",
        type=float,
        default=None,
        help="synthetic: probability of a sub-agent group after a turn (default: fitted, 0.07%%)",
    )
    g.add_argument("--seed", type=int, default=0, help="prompt content, session order and synthetic draws")


def _replay_args(p: argparse.ArgumentParser) -> None:
    d = ReplayConfig()
    g = p.add_argument_group("replay")
    g.add_argument("--agents", type=int, default=8, help="concurrent agent lanes")
    g.add_argument("--warmup", type=float, default=30.0, help="seconds before the measured window")
    g.add_argument("--duration", type=float, default=300.0, help="seconds measured")
    g.add_argument(
        "--ramp", type=float, default=None, help="lane start stagger in seconds (default: --warmup)"
    )
    g.add_argument("--max-requests", type=int, default=d.max_requests, help="stop after this many requests")
    g.add_argument("--max-sessions", type=int, default=None, help="stop after this many sessions finished")
    g.add_argument("--mode", default=d.mode, choices=MODES, help="token-id prompts or chat messages")
    g.add_argument("--served-model", default=None, help="model name to send (default: the server's)")
    g.add_argument("--temperature", type=float, default=d.temperature)
    g.add_argument("--request-timeout", type=float, default=d.request_timeout_s, help="seconds per request")
    g.add_argument("--num-gpus", type=int, default=d.num_gpus, help="GPUs behind the server (per-GPU rates)")
    g.add_argument(
        "--max-token-id",
        type=int,
        default=d.max_token_id,
        help="prompt token ids are drawn below this (default: the embedded tokenizer's regular ids)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = p.add_argument_group("scale (recorded in the report)")
    s.add_argument(
        "--length-scale",
        default="1.0",
        help="multiply trace token lengths (blocks, in, out); 'auto': fit 90%% of sessions in --max-context",
    )
    s.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="prompt + output limit; a session ends before a longer prompt (default: the server's)",
    )
    s.add_argument("--time-scale", type=float, default=1.0, help="multiply think times")
    s.add_argument("--max-think-time", type=float, default=None, help="cap one think time (seconds, scaled)")
    s.add_argument("--max-output-tokens", type=int, default=None, help="cap max_tokens of a request")


def _cost_args(p: argparse.ArgumentParser) -> None:
    d = Prices()
    g = p.add_argument_group("cost view (defaults: see flashstate/bench/cost.py)")
    g.add_argument("--gpu-price-per-hour", type=float, default=d.gpu_per_hour, help="$ per GPU-hour")
    g.add_argument("--price-input", type=float, default=d.input_per_m, help="$ per M uncached input tokens")
    g.add_argument(
        "--price-cached-input", type=float, default=d.cached_input_per_m, help="$ per M cached input tokens"
    )
    g.add_argument("--price-output", type=float, default=d.output_per_m, help="$ per M output tokens")


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="agentic replay benchmark (run, compare policies, trace stats)")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    run = bsub.add_parser("run", help="replay agents against a running server")
    run.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    run.add_argument("--label", default="run", help="name of this run in the report")
    cmp = bsub.add_parser("compare", help="one fresh server per cache policy, same workload, one report")
    cmp.add_argument(
        "--policies", default="flashstate,vllm", help=f"comma-separated, from {', '.join(CACHE_POLICIES)}"
    )
    cmp.add_argument(
        "--reference", default=None, help="policy the ratios are against (default: vllm or last)"
    )
    cmp.add_argument("--model", default=None, help="model directory for the servers (default: embedded tiny)")
    cmp.add_argument("--serve-args", default="", help="more `flashstate serve` flags, one quoted string")
    cmp.add_argument("--server-timeout", type=float, default=600.0, help="seconds for a server to start")
    for p in (run, cmp):
        _workload_args(p)
        _replay_args(p)
        _cost_args(p)
        p.add_argument("--out", default=None, help="output directory (default: bench-results/<UTC time>)")
    stats = bsub.add_parser("stats", help="a trace set's statistics and the synthetic generator fitted to it")
    stats.add_argument("path", help="trace file or directory")
    stats.add_argument("--trace-format", default="auto", choices=["auto", "agentx", "mooncake"])
    stats.add_argument("--trace-block-size", type=int, default=None)
    stats.add_argument("--trace-limit", type=int, default=None)


# ---------------------------------------------------------------------------------------------------


def _make_workload(args: argparse.Namespace) -> tuple[Workload, dict[str, Any], list[Session]]:
    """(factory giving the same sessions on each call, description, a sample for --length-scale auto)."""
    if args.workload == "synthetic":
        cfg = synthetic.DEFAULT
        if args.subagent_prob is not None:
            cfg = replace(cfg, subagent_prob=args.subagent_prob)
        info = {
            "kind": "synthetic",
            "source": "flashstate.bench.synthetic (fitted to Claude-Code traces)",
            "seed": args.seed,
            "subagent_prob": cfg.subagent_prob,
        }
        return (
            (lambda: synthetic.session_stream(cfg, args.seed)),
            info,
            synthetic.generate(cfg, 200, args.seed),
        )
    sessions = load_workload(args.workload, args.trace_format, args.trace_block_size, args.trace_limit)
    info = {
        "kind": trace_format(args.workload, args.trace_format),
        "source": str(args.workload),
        "sessions": len(sessions),
        "seed": args.seed,
        "requests": sum(len(s.requests) for top in sessions for _, s in top.walk()),
    }
    return (lambda: sessions), info, sessions


def _server_max_len(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/v1/models", timeout=10.0).json()["data"][0].get("max_model_len")
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None


def _scale(args: argparse.Namespace, sample: list[Session], url: str | None) -> dict[str, Any]:
    auto = args.length_scale == "auto"
    if auto:
        max_context = args.max_context or (url and _server_max_len(url))
        if not max_context:
            raise ValueError(
                "--length-scale auto needs --max-context (or a server that reports max_model_len)"
            )
        length_scale = auto_length_scale(sample, max_context)
    else:
        try:
            length_scale = float(args.length_scale)
        except ValueError as e:
            raise ValueError(f"--length-scale: a number or 'auto', got {args.length_scale!r}") from e
    return {
        "length_scale": length_scale,
        "length_scale_auto": auto,
        "max_context": args.max_context,
        "time_scale": args.time_scale,
        "max_think_s": args.max_think_time,
        "max_output_tokens": args.max_output_tokens,
    }


def _replay_config(args: argparse.Namespace, scale: dict[str, Any], url: str) -> ReplayConfig:
    return ReplayConfig(
        base_url=url.rstrip("/"),
        model=args.served_model,
        mode=args.mode,
        agents=args.agents,
        warmup_s=args.warmup,
        duration_s=args.duration,
        ramp_s=args.warmup if args.ramp is None else args.ramp,
        max_requests=args.max_requests,
        max_sessions=args.max_sessions,
        time_scale=scale["time_scale"],
        max_think_s=scale["max_think_s"],
        length_scale=scale["length_scale"],
        max_context=scale["max_context"],
        max_output_tokens=scale["max_output_tokens"],
        temperature=args.temperature,
        seed=args.seed,
        max_token_id=args.max_token_id,
        request_timeout_s=args.request_timeout,
        num_gpus=args.num_gpus,
        progress=not args.no_progress,
    )


def _prices(args: argparse.Namespace) -> Prices:
    return Prices(args.gpu_price_per_hour, args.price_input, args.price_cached_input, args.price_output)


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out:
        return Path(args.out)
    return Path("bench-results") / dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")


def _finish(results: dict[str, dict[str, Any]], out: Path, reference: str | None, title: str) -> int:
    files = write_report(out, results, reference, title)
    print(markdown(results, reference, title))
    print(f"wrote {', '.join(str(p) for p in files.values())}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    from flashstate.bench.compare import ServerError, ServerSpec, run_compare

    workload, info, sample = _make_workload(args)
    if args.bench_command == "run":
        scale = _scale(args, sample, args.url)
        run = replay(_replay_config(args, scale, args.url), workload())
        result = build_result(run, args.label, info, scale, _prices(args))
        return _finish({args.label: result}, _out_dir(args), None, "flashstate bench run")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in CACHE_POLICIES]
    if bad or not policies:
        raise ValueError(f"--policies: unknown {bad}; choose from {', '.join(CACHE_POLICIES)}")
    reference = args.reference or ("vllm" if "vllm" in policies else policies[-1])
    scale = _scale(args, sample, None)
    serve_args = (("--model", args.model) if args.model else ()) + tuple(shlex.split(args.serve_args))
    spec = ServerSpec(serve_args, args.server_timeout)
    out = _out_dir(args)
    try:
        results = run_compare(
            policies,
            _replay_config(args, scale, "http://127.0.0.1"),
            workload,
            info,
            scale,
            _prices(args),
            spec,
            out,
            log=lambda m: print(m, file=sys.stderr),
        )
    except ServerError as e:
        print(f"flashstate bench: {e}", file=sys.stderr)
        return 1
    return _finish(results, out, reference, f"flashstate bench compare: {', '.join(policies)}")


def _stats(args: argparse.Namespace) -> int:
    sessions = load_workload(args.path, args.trace_format, args.trace_block_size, args.trace_limit)
    doc = {
        "sessions": len(sessions),
        "agents": synthetic.describe(sessions, 0),
        "subagents": synthetic.describe(sessions, 1),
        "fitted": _plain(synthetic.fit(sessions)),
    }
    print(json.dumps(doc, indent=1))
    return 0


def _plain(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return {k: _plain(getattr(obj, k)) for k in obj.__dataclass_fields__}
    if isinstance(obj, tuple):
        return [_plain(x) for x in obj]
    return obj


def run_bench(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    try:
        return _stats(args) if args.bench_command == "stats" else _run(args)
    except (ValueError, OSError) as e:  # WorkloadError is a ValueError
        print(f"flashstate bench: error: {e}", file=sys.stderr)
        return 2


__all__ = ["WorkloadError", "add_bench_parser", "run_bench"]
