"""`flashstate bench run | compare | stats` (flags: cli_args.py): flags → workload, ReplayConfig, prices;
results written to `--out` (result JSON, report.md, PNGs) and the table printed."""

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

from flashstate import envs
from flashstate.bench import synthetic
from flashstate.bench.compare import ServerError, ServerSpec, Variant, run_compare
from flashstate.bench.config import ReplayConfig
from flashstate.bench.cost import Prices
from flashstate.bench.prompts import auto_length_scale
from flashstate.bench.replay import replay
from flashstate.bench.report import (
    RESULT_SCHEMA,
    build_result,
    markdown,
    over_whole_run,
    read_result,
    result_files,
    write_report,
)
from flashstate.bench.synthetic_defaults import DEFAULT as SYNTHETIC_DEFAULT
from flashstate.bench.workloads import Session, WorkloadError, load_workload, trace_format
from flashstate.config import CACHE_POLICIES
from flashstate.lifeline import Terminated, terminate_on_signals

Workload = Callable[[], list[Session] | Iterator[Session]]


def make_workload(args: argparse.Namespace) -> tuple[Workload, dict[str, Any], Callable[[], list[Session]]]:
    """(factory giving the same sessions on each call, description, a sample for --length-scale auto)."""
    if args.workload == "synthetic":
        if args.trace_split is not None:
            raise ValueError("--trace-split splits a trace set; the synthetic workload has none")
        cfg = SYNTHETIC_DEFAULT
        if args.subagent_prob is not None:
            cfg = replace(cfg, subagent_prob=args.subagent_prob)
        info = {
            "kind": "synthetic",
            "source": "flashstate.bench.synthetic_defaults (fitted to Claude-Code traces)",
            "seed": args.seed,
            "subagent_prob": cfg.subagent_prob,
        }
        return (
            (lambda: synthetic.session_stream(cfg, args.seed)),
            info,
            lambda: synthetic.generate(cfg, 200, args.seed),
        )
    sessions = load_workload(
        args.workload, args.trace_format, args.trace_block_size, args.trace_limit, args.trace_split
    )
    info = {
        "kind": trace_format(args.workload, args.trace_format),
        "source": str(args.workload),
        "sessions": len(sessions),
        "split": args.trace_split,
        "seed": args.seed,
        "requests": sum(len(s.requests) for top in sessions for _, s in top.walk()),
    }
    return (lambda: sessions), info, lambda: sessions


def api_key(args: argparse.Namespace) -> str | None:
    return getattr(args, "api_key", None) or envs.OPENAI_API_KEY


def auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _server_max_len(url: str, key: str | None) -> int | None:
    try:
        resp = httpx.get(f"{url}/v1/models", timeout=10.0, headers=auth_headers(key))
        return resp.json()["data"][0].get("max_model_len")
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None


def length_scale_for(
    args: argparse.Namespace, sample: Callable[[], list[Session]], url: str | None
) -> dict[str, Any]:
    auto = args.length_scale == "auto"
    if auto:
        max_context = args.max_context or (url and _server_max_len(url, api_key(args)))
        if not max_context:
            raise ValueError(
                "--length-scale auto needs --max-context (or a server that reports max_model_len)"
            )
        length_scale = auto_length_scale(sample(), max_context)
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


def replay_config_from_args(args: argparse.Namespace, scale: dict[str, Any], url: str) -> ReplayConfig:
    return ReplayConfig(
        base_url=url.rstrip("/"),
        model=args.served_model,
        api_key=api_key(args),
        mode=args.mode,
        chat_thinking_share=args.chat_thinking_share,
        chat_tools=not args.no_chat_tools,
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
        drain_s=args.drain,
        retries=args.retries,
        num_gpus=args.num_gpus,
        progress=not args.no_progress,
    )


def prices_from_args(args: argparse.Namespace) -> Prices:
    return Prices(args.gpu_price_per_hour, args.price_input, args.price_cached_input, args.price_output)


def out_dir_from_args(args: argparse.Namespace) -> Path:
    if args.out:
        return Path(args.out)
    return Path("bench-results") / dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")


def write_and_print_report(
    results: dict[str, dict[str, Any]], out: Path, reference: str | None, title: str
) -> int:
    files = write_report(out, results, reference, title)
    print(markdown(results, reference, title))
    print(f"wrote {', '.join(str(p) for p in files.values())}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    workload, info, sample = make_workload(args)
    if args.bench_command == "run":
        scale = length_scale_for(args, sample, args.url)
        run = replay(replay_config_from_args(args, scale, args.url), workload())
        result = build_result(run, args.label, info, scale, prices_from_args(args))
        return write_and_print_report(
            {args.label: result}, out_dir_from_args(args), None, "flashstate bench run"
        )
    variants = parse_variants(args.policies, getattr(args, "variant", None) or [])
    names = [v.name for v in variants]
    reference = args.reference or ("vllm" if "vllm" in names else names[-1])
    if reference not in names:
        raise ValueError(f"--reference {reference!r} is none of the compared runs: {', '.join(names)}")
    scale = length_scale_for(args, sample, None)
    serve_args = (("--model", args.model) if args.model else ()) + tuple(shlex.split(args.serve_args))
    if api_key(args) and "--api-key" not in serve_args:
        serve_args += ("--api-key", api_key(args))
    if args.mode == "chat" and not args.no_chat_tools and "--tool-call-parser" not in serve_args:
        # tools with tool_choice "auto" need a tool-call parser; the default template writes hermes calls
        serve_args += ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    spec = ServerSpec(serve_args, args.server_timeout)
    out = out_dir_from_args(args)
    try:
        results = run_compare(
            variants,
            replay_config_from_args(args, scale, "http://127.0.0.1"),
            workload,
            info,
            scale,
            prices_from_args(args),
            spec,
            out,
            log=lambda m: print(m, file=sys.stderr),
            rounds=args.rounds,
        )
    except ServerError as e:
        print(f"flashstate bench: {e}", file=sys.stderr)
        return 1
    return write_and_print_report(results, out, reference, f"flashstate bench compare: {', '.join(names)}")


def parse_variants(policies: str, specs: list[str]) -> list[Variant]:
    """`--policies a,b` plus each `--variant "NAME=POLICY [serve flags]"`, names unique."""
    out = [Variant(p.strip(), p.strip()) for p in policies.split(",") if p.strip()]
    for spec in specs:
        words = shlex.split(spec)
        name, sep, policy = words[0].partition("=") if words else ("", "", "")
        if not sep or not name or not policy:
            raise ValueError(f"--variant {spec!r}: expected NAME=POLICY followed by serve flags")
        out.append(Variant(name, policy, tuple(words[1:])))
    bad = sorted({v.policy for v in out} - set(CACHE_POLICIES))
    if bad or not out:
        raise ValueError(
            f"unknown cache policy {bad or '(none given)'}; choose from {', '.join(CACHE_POLICIES)}"
        )
    seen = [v.name for v in out]
    if len(set(seen)) != len(seen):
        raise ValueError(f"compared runs need distinct names, got {', '.join(seen)}")
    return out


def _report(args: argparse.Namespace) -> int:
    """Merge the result files of separate `bench compare`/`simulate` runs into one report."""
    results: dict[str, dict[str, Any]] = {}
    for given in map(Path, args.results):
        files = result_files(given)
        if not files:
            raise ValueError(f"no result-*.json in {given}")
        for f in files:
            doc = read_result(f)
            if doc.get("schema") != RESULT_SCHEMA:
                raise ValueError(f"{f} is not a flashstate bench result (schema {doc.get('schema')!r})")
            if doc["label"] in results:
                raise ValueError(f"two results are labelled {doc['label']!r}")
            results[doc["label"]] = over_whole_run(doc) if args.whole_run else doc
    names = list(results)
    reference = args.reference or ("vllm" if "vllm" in names else names[-1])
    if reference not in names:
        raise ValueError(f"--reference {reference!r} is none of the results: {', '.join(names)}")
    return write_and_print_report(results, Path(args.out), reference, args.title)


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
        # SIGTERM unwinds like Ctrl-C: the server a compare started is stopped on the way out.
        with terminate_on_signals():
            if args.bench_command == "report":
                return _report(args)
            return _stats(args) if args.bench_command == "stats" else _run(args)
    except (ValueError, OSError) as e:  # WorkloadError is a ValueError
        print(f"flashstate bench: error: {e}", file=sys.stderr)
        return 2
    except Terminated as e:
        print(f"flashstate bench: {e}", file=sys.stderr)
        return 128 + e.signum


__all__ = ["WorkloadError", "run_bench"]
