"""`flashstate simulate` (flags: cli_args.py): flags → profile, engine config per policy, the bench workload
and ReplayConfig; one simulated run per policy; results written like `bench compare`'s."""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from flashstate.args import add_cache_args, add_engine_args, config_from_args
from flashstate.bench.command import (
    length_scale_for,
    make_workload,
    out_dir_from_args,
    parse_variants,
    prices_from_args,
    replay_config_from_args,
    write_and_print_report,
)
from flashstate.bench.config import ReplayConfig
from flashstate.bench.replay import SessionSource
from flashstate.bench.report import build_result, read_result
from flashstate.bench.step_summary import STEP_FIELDS, summarize
from flashstate.config import EngineConfig
from flashstate.sim.engine import SimEngine
from flashstate.sim.events import EventLoop
from flashstate.sim.fit import (
    fit_chat_costs,
    fit_noise,
    fit_request_overhead,
    fitted_profile,
    loop_share,
    read_request_lines,
    read_steps,
)
from flashstate.sim.fit_host import fit_host_calls
from flashstate.sim.profile import NO_STEP_NOISE, Profile, load_profile, utc_time
from flashstate.sim.recorded import recorded_send_times
from flashstate.sim.replay import SimReplay
from flashstate.spec.hf_config import spec_of


def engine_config(profile: Profile, serve_args: list[str], policy: str) -> EngineConfig:
    """The profile's engine flags, then `serve_args`, then the policy (later flags win, as on a CLI)."""
    p = argparse.ArgumentParser(prog="--serve-args", exit_on_error=False, add_help=False)
    add_engine_args(p)
    add_cache_args(p)
    try:
        args = p.parse_args([*profile.serve_args(), *serve_args, "--cache-policy", policy])
    except argparse.ArgumentError as e:
        raise ValueError(f"--serve-args: {e}") from e
    return config_from_args(args)


def make_engines(
    profile: Profile,
    config: EngineConfig,
    n: int,
    loop: EventLoop,
    model: str | None = None,
    noise_seed: int = 0,
) -> list[SimEngine]:
    """`n` engines on `profile`; each draws its steps' noise from its own stream of `noise_seed`."""
    spec = spec_of(model or profile.model)
    return [
        SimEngine(
            config,
            spec,
            profile.dtype,
            profile.prefill,
            profile.decode,
            clock=lambda: loop.now,
            prefill_step_s=profile.prefill_step_s,
            graphed_step_s=profile.graphed_step_s,
            graphed_max_exports=profile.graphed_max_exports,
            charge_host_calls=not profile.host_calls_in_steps,
            engine_cost=profile.engine_cost,
            host_calls=profile.host_calls,
            events=profile.events,
            noise=profile.noise,
            noise_seed=f"{noise_seed}/{i}",
        )
        for i in range(n)
    ]


def simulate(
    profile: Profile,
    config: EngineConfig,
    replay: ReplayConfig,
    sessions: Any,
    model: str | None = None,
    step_trace: Path | None = None,
    send_times: dict[tuple[str, int], float] | None = None,
    noise_seed: int = 0,
    unspliced_per_token: float = 0.0,
) -> tuple[Any, dict[str, Any]]:
    """One simulated run: (ReplayResult, facts about the simulation for the result's `server`); with
    `step_trace`, the first engine's step rows and request lines written there (gzipped JSON lines); with
    `send_times` ((session, turn) -> seconds), each turn sent when a recorded run sent it (SimReplay);
    `noise_seed` seeds the steps' noise where the profile has some; `unspliced_per_token`: SimReplay's."""
    loop = EventLoop()
    engines = make_engines(profile, config, replay.num_gpus, loop, model, noise_seed)
    if replay.max_context is None:
        replay = replace(replay, max_context=engines[0].max_model_len)
    source = SessionSource(sessions, replay.seed, replay.max_sessions)
    t0 = time.process_time()
    overhead = profile.request_overhead_for(replay.mode)
    run = SimReplay(
        replay, engines, loop, source, overhead, profile.chat, send_times, unspliced_per_token
    ).run()
    run.model = model or profile.model
    rows = [dict(zip(STEP_FIELDS, r, strict=True)) for r in engines[0].step_rows]
    if engines[0].host is None:  # as the engine's trace: host_ms only beside a host tier
        rows = [{k: v for k, v in r.items() if k != "host_ms"} for r in rows]
    if step_trace is not None:
        lines = (json.dumps(r) + "\n" for r in [*rows, *engines[0].request_rows])
        step_trace.write_bytes(gzip.compress("".join(lines).encode()))
    facts = profile.describe() | {
        "cache_plan": engines[0].plan.describe(),
        "engines": len(engines),
        "engine_steps": sum(e.steps for e in engines),
        "engine_busy_s": sum(e.busy_seconds for e in engines),
        "steps": summarize(rows, engines[0].request_rows),
        "noise_seed": noise_seed,
        "cpu_s": time.process_time() - t0,
        "cache_stats": [_stats(e) for e in engines],
    }
    return run, facts


def _stats(engine: SimEngine) -> dict[str, Any]:
    s = engine.cache.stats
    return {
        "queries": s.queries,
        "hits": s.hits,
        "cached_tokens": s.cached_tokens,
        "uncached_tokens": s.uncached_tokens,
        "admissions_refused": s.admissions_refused,
        "evictions": dict(s.evictions),
        "preemptions_recompute": engine.scheduler.stats.preemptions_recompute,
        "preemptions_checkpoint": engine.scheduler.stats.preemptions_checkpoint,
        "admission_blocked": engine.scheduler.stats.admission_blocked,
        "max_queue_wait_s": engine.scheduler.stats.max_queue_wait,
    } | (
        {}
        if engine.host is None
        else {
            "host_restores_started": engine.host.restores_started,
            "host_prefetches": engine.host.prefetches,  # read-aheads started, and taken over by a restore
            "host_prefetches_used": engine.host.prefetches_used,
            "host_hits": s.host_hits,
            "host_states": len(engine.host.index),
            "host_bytes_used": engine.host.index.used,
            "host_evictions": engine.host.index.evictions,
            "host_engine_s": engine.host.engine_seconds,
            "host_engine_s_by_call": dict(engine.host.engine_seconds_by_call),
        }
    )


def _run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    if args.engine_as_of is not None:
        profile = profile.as_of(utc_time(args.engine_as_of, "--engine-as-of"))
    if args.step_cost_scale != 1.0:
        profile = profile.with_step_costs_scaled(args.step_cost_scale)
    if args.no_step_noise:
        profile = replace(profile, noise=NO_STEP_NOISE)
    if args.step_noise_seed is not None and profile.noise == NO_STEP_NOISE:
        why = (
            "--no-step-noise is given" if args.no_step_noise else f"profile {profile.name} has no step noise"
        )
        raise ValueError(f"--step-noise-seed: nothing to seed ({why})")
    seed = args.step_noise_seed or 0
    if not 0 <= args.chat_unspliced_per_token < 1:
        raise ValueError(f"--chat-unspliced-per-token must be in [0, 1), got {args.chat_unspliced_per_token}")
    if args.chat_unspliced_per_token and args.mode != "chat":
        raise ValueError("--chat-unspliced-per-token needs --mode chat (token prompts re-send their ids)")
    variants = parse_variants(args.policies, args.variant or [])
    names = [v.name for v in variants]
    reference = args.reference or ("vllm" if "vllm" in names else names[-1])
    if reference not in names:
        raise ValueError(f"--reference {reference!r} is none of the compared runs: {', '.join(names)}")
    workload, info, sample = make_workload(args)
    scale = length_scale_for(args, sample, None)
    replay = replace(replay_config_from_args(args, scale, f"sim://{profile.name}"), progress=False)
    serve_args = shlex.split(args.serve_args)
    # every bad flag before any run
    configs = {v.name: engine_config(profile, [*serve_args, *v.serve_args], v.policy) for v in variants}
    send_times = recorded_send_times(read_result(Path(args.send_times))) if args.send_times else None
    results = {}
    out = Path(out_dir_from_args(args))
    if args.step_trace:
        out.mkdir(parents=True, exist_ok=True)
    for v in variants:
        print(f"== {v.name}: simulating on {profile.name}", file=sys.stderr)
        trace = out / f"steps-{v.name}.jsonl.gz" if args.step_trace else None
        run, facts = simulate(
            profile, configs[v.name], replay, workload(), args.model, trace, send_times, seed,
            args.chat_unspliced_per_token,
        )
        server = {
            "command": ["flashstate", "simulate", *sys.argv[2:]] if sys.argv[1:2] == ["simulate"] else None,
            "cache_policy": v.policy,
            "serve_args": list(v.serve_args),
            "simulated": facts,
        }
        results[v.name] = build_result(run, v.name, info, scale, prices_from_args(args), server)
        print(f"== {v.name}: {facts['cpu_s']:.1f} s CPU, {facts['engine_steps']} steps", file=sys.stderr)
    title = f"flashstate simulate ({profile.name}): {', '.join(names)}"
    return write_and_print_report(results, out, reference, title)


def run_simulate(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (ValueError, OSError, KeyError) as e:  # ProfileError, WorkloadError are ValueErrors
        print(f"flashstate simulate: error: {e}", file=sys.stderr)
        return 2


def run_fit_profile(args: argparse.Namespace) -> int:
    try:
        base = load_profile(args.base)
        traces = [Path(t) for t in args.traces]
        out = Path(args.out)
        if args.keep_steps and not args.results:
            raise ValueError("--keep-steps keeps --base's step model and fits what --results give: name them")
        steps = [read_steps([t]) for t in traces]  # each trace read once, for the step model and chat costs
        overhead, server, client, mode, host = None, [], [], None, None
        if args.results:
            if len(args.results) != len(traces):
                raise ValueError("--results: one bench result per step trace, in the same order")
            modes, runs = set(), []
            for trace, result in zip(traces, args.results, strict=True):
                server.append(read_request_lines(trace))
                run = read_result(Path(result))  # as written, or gzipped as benchmarks/results keeps them
                runs.append(run)
                client += run["requests"]
                modes.add(run.get("replay", {}).get("mode", "completions"))
            if len(modes) > 1:
                raise ValueError("--results: runs of one replay mode (chat prompts cost the server more)")
            mode = modes.pop()
            overhead = fit_request_overhead([r for lines in server for r in lines], client) | {"mode": mode}
            host = fit_host_calls(runs)
        earlier = None
        if args.host_earlier:
            earlier = []
            for until, *results in sorted(args.host_earlier, key=lambda e: utc_time(e[0], "--host-earlier")):
                if not results:
                    raise ValueError(f"--host-earlier {until}: name the bench results measured before it")
                fitted = fit_host_calls([read_result(Path(r)) for r in results])
                if fitted is None:
                    raise ValueError(f"--host-earlier {until}: none of {results} restored from a host tier")
                earlier.append((until, *fitted))
        name, sources, rows = args.name or out.stem, [t.name for t in traces], [r for rs in steps for r in rs]
        doc = fitted_profile(base, rows, name, sources, overhead, args.keep_steps, host, earlier)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        written = load_profile(str(out))
        # the steps' spread around the step model just written (a kept model keeps its noise)
        doc["noise"] = asdict(base.noise) if args.keep_steps else fit_noise(written, rows)
        if mode == "chat":  # what a chat prompt costs beyond its tokens, against the step model just written
            runs = list(zip(steps, server, strict=True))
            doc["chat"] = fit_chat_costs(written, runs, client)
            doc["provenance"] += "; chat costs from the same runs"
        out.write_text(json.dumps(doc, indent=1) + "\n")
        load_profile(str(out))  # what was written loads
    except (ValueError, OSError) as e:
        print(f"flashstate fit-profile: error: {e}", file=sys.stderr)
        return 2
    d, p = doc["decode"], doc["prefill"]
    print(
        f"{out}: decode {1e3 * d['base_s']:.3f} ms + {1e6 * d['per_seq_s']:.1f} µs/seq + "
        f"{1e9 * d['per_token_s']:.3f} ns/context token; C(n) = {p['a']:.3e}·n + {p['b']:.3e}·n² s, "
        f"{1e3 * p['step_s']:.1f} ms per step with prefill"
        + (f" ({1e3 * p['graphed_step_s']:.1f} ms graphed)" if "graphed_step_s" in p else "")
        + f"; {1e3 * doc['events']['admit_s']:.2f} ms per request admitted, "
        f"{1e3 * doc['events']['finish_s']:.2f} ms per request finished"
        + f"; request overhead {1e3 * doc['request']['overhead_s']:.1f} ms + "
        f"{1e9 * doc['request']['overhead_per_token_s']:.0f} ns/prompt token"
        + (_chat_said(doc["chat"]) if mode == "chat" else "")
        + f"; steps' spread (log sd) {doc['noise']['prefill_sd']:.3f} with prefill, "
        f"{doc['noise']['decode_sd']:.3f} decode"
    )
    print(f"engine loop between steps: {100 * loop_share(rows):.1f}% of the traced steps' spans")
    return 0


def _chat_said(c: dict[str, Any]) -> str:
    return (
        f"; chat: template {c['header_tokens']} + {c['per_message_tokens']:.1f}/message + "
        f"{100 * c['text_share']:.1f}% of the text, {1e9 * c['engine_per_token_s']:.0f} ns of the engine "
        f"thread/prompt token and {1e3 * c['engine_per_admit_s']:.2f} ms/admission"
    )
