"""A recorded run as a simulation: the `flashstate simulate` arguments that replay a `bench compare` result's
workload, trace half, scale and engine flags on a profile, and the simulator's error against the run.

    simulate_argv(result, profile, traces)  `simulate` arguments for the run's policy under its own label
    engine_cost(result)                     the prefill cost C(n) the run's engine priced its cache with
    error(simulated, measured)              metric -> simulated / measured − 1 (hit rate: the difference)
    median_summary(summaries)               each metric's median over simulated runs (noise seeds)
    recorded_send_times(result)             (session, turn) -> when the run sent it (`simulate --send-times`)
"""

from __future__ import annotations

import re
import shlex
import statistics
from pathlib import Path
from typing import Any

from flashstate.default_tokenizer import DEFAULT_SPECIAL_TOKENS, DEFAULT_VOCAB_SIZE
from flashstate.sim.replay import session_key

# the serve flags of a recorded command that shape the engine (the rest: where it ran, what it logged), with
# their values, and its on/off switches
ENGINE_FLAGS = (
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--kv-cache-memory-bytes",
    "--host-chunk-tokens",
)
ENGINE_SWITCHES = (
    "--host-prefetch", "--no-host-prefetch", "--host-inline-fetch", "--no-host-inline-fetch",
    "--reserve-working-slots", "--no-reserve-working-slots",
)  # fmt: skip
# defaults that held for a while: (from, until: UTC times as results stamp them, the switch a run made then
# had by default, its opposite, which runs had it: "host" with a host tier, "flashstate" of that policy); the
# first is added where the command says neither. Read-aheads were on by default from 86c8082 until the H200
# measured them (RESULTS.md, "Host hits read ahead while queued"); flashstate's working slots were reserved
# apart from its shared budget until they were charged to it (RESULTS.md, "Working slots charged to the
# budget").
OLD_DEFAULTS = (
    ("2026-12-05T00:00", "2026-12-05T02:30", "--host-prefetch", "--no-host-prefetch", "host"),
    ("", "2026-12-05T10:00", "--reserve-working-slots", "--no-reserve-working-slots", "flashstate"),
)
# until 85d4391 the server re-tokenized a re-sent reply holding a special token its text hid (the
# random-weight presets sample the default tokenizer's ids, 3 of them special): a chat run of then replays so
UNSPLICED_UNTIL = "2026-12-06T03:03:11"
UNSPLICED_PER_TOKEN = len(DEFAULT_SPECIAL_TOKENS) / DEFAULT_VOCAB_SIZE
COST_METRIC = "flashstate:prefill_cost_coefficient{"
_TERM = re.compile(r'term="([ab])"')
METRICS = {
    "hit rate": lambda s: s["token_hit_rate"],
    "uncached p50": lambda s: s["uncached_tokens_per_request"]["p50"],
    "TTFT p50": lambda s: s["ttft_s"]["p50"],
    "TTFT p90": lambda s: s["ttft_s"]["p90"],
    "output TPM": lambda s: s["output_tpm"],
}


def engine_cost(result: dict[str, Any]) -> tuple[float, float] | None:
    """(a, b) of the prefill cost C(n) = a·n + b·n² the run's engine used (its calibration, which prices
    every checkpoint and KV path it keeps or evicts), read from the server's `/metrics` after the run; None
    where the result has no such reading (a run of another server, or recorded without metrics)."""
    after = (result.get("server_metrics") or {}).get("after") or {}
    terms = {
        m.group(1): value
        for key, value in after.items()
        if key.startswith(COST_METRIC) and (m := _TERM.search(key)) is not None
    }
    return (terms["a"], terms["b"]) if len(terms) == 2 else None


def simulate_argv(result: dict[str, Any], profile: str, traces: str | Path) -> list[str]:
    """`flashstate simulate` arguments (no --out) for the recorded run: its policy and variant flags under its
    label (`flashstate-host` stays that), the engine flags and switches its server command had (and a default
    of the run's time that is no longer one), the prefill cost its engine priced its cache with (the card's
    calibration, not the profile's: which states stay depends on it), the run's time (the engine's costs
    then, where the profile dates them; a chat run's unspliced replies before 85d4391), and the replay's
    seed, agents, windows, scale and trace half."""
    r, server = result["replay"], result["server"]
    command = server["command"]
    flags = [f"{k} {command[command.index(k) + 1]}" for k in ENGINE_FLAGS if k in command]
    if (cost := engine_cost(result)) is not None:
        flags.append(f"--prefill-cost-coefficients {cost[0]!r} {cost[1]!r}")
    flags += [k for k in ENGINE_SWITCHES if k in command]
    created, policy = result.get("created", ""), server.get("cache_policy") or result["label"]
    had = {
        "host": bool({"--host-cache", "--host-cache-bytes"} & set(command)),
        "flashstate": policy == "flashstate",
    }
    flags += [
        then
        for since, until, then, other, runs in OLD_DEFAULTS
        if had[runs] and since <= created < until and then not in command and other not in command
    ]
    variant = shlex.join([f"{result['label']}={policy}", *server.get("variant_args", [])])
    split = result["workload"].get("split")
    mode = r.get("mode", "completions")
    unspliced = mode == "chat" and created < UNSPLICED_UNTIL
    return [
        "simulate", *(["--trace-split", split] if split else []), "--profile", profile,
        "--workload", str(traces), "--policies", "", "--variant", variant,
        "--serve-args", " ".join(flags), "--seed", str(r["seed"]), "--agents", str(r["agents"]),
        "--warmup", str(r["warmup_s"]), "--duration", str(r["duration_s"]), "--drain", str(r["drain_s"]),
        "--length-scale", str(r["length_scale"]), "--max-context", str(r["max_context"]),
        "--time-scale", str(r["time_scale"]), "--max-think-time", str(r["max_think_s"]),
        "--max-output-tokens", str(r["max_output_tokens"]), "--mode", mode,
        *(["--chat-unspliced-per-token", repr(UNSPLICED_PER_TOKEN)] if unspliced else []),
        *(["--engine-as-of", created] if created else []), "--no-progress",
    ]  # fmt: skip


def median_summary(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """A summary holding, for each of METRICS, its median over `summaries` (the runs at several noise seeds:
    the prediction of a figure that a few requests set); a metric no run has stays None."""
    mid = {}
    for name, pick in METRICS.items():
        values = [v for s in summaries if (v := pick(s)) is not None]
        mid[name] = statistics.median(values) if values else None
    return {
        "token_hit_rate": mid["hit rate"],
        "uncached_tokens_per_request": {"p50": mid["uncached p50"]},
        "ttft_s": {"p50": mid["TTFT p50"], "p90": mid["TTFT p90"]},
        "output_tpm": mid["output TPM"],
    }


def error(simulated: dict[str, Any], measured: dict[str, Any]) -> dict[str, float | None]:
    """Each metric's error: simulated / measured − 1; hit rate in points (simulated − measured); None where
    either run has no value (no request answered in its window)."""
    out: dict[str, float | None] = {}
    for name, pick in METRICS.items():
        got, want = pick(simulated), pick(measured)
        if got is None or want is None or (name != "hit rate" and not want):
            out[name] = None
        else:
            out[name] = got - want if name == "hit rate" else got / want - 1
    return out


def recorded_send_times(result: dict[str, Any]) -> dict[tuple[str, int], float]:
    """When the recorded run sent each turn, by session (without its draw numbers) and turn: the first
    send where a session was drawn twice."""
    times: dict[tuple[str, int], float] = {}
    for r in result["requests"]:
        times.setdefault((session_key(r["session"]), r["turn"]), r["t_send"])
    return times
