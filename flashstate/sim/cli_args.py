"""The `flashstate simulate` flags: `bench compare`'s (workload, replay, cost, --policies, --serve-args), so
a measured compare and its simulation take one command line, plus the hardware profile.

    flashstate simulate --profile h200-qwen3-next-2b --policies flashstate,vllm,sglang,none \\
        --workload ../shared/traces/claude-code --agents 48 --max-sessions 166 --duration 1e9 \\
        --serve-args "--kv-cache-memory-bytes 40G" --out sim-results/48
"""

from __future__ import annotations

import argparse

from flashstate.bench.cli_args import compare_args, cost_args, replay_args, workload_args


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser(
        "simulate",
        help="discrete-event simulation of `bench compare`: real scheduler and cache, time from a profile",
        description="Replays the same workload as `flashstate bench compare` against simulated engines (the "
        "real scheduler and prefix cache with pools as counters; step times from the hardware profile's "
        "prefill and decode model) and writes the same result JSON, report and plots. --serve-args are "
        "applied over the profile's engine flags; --num-gpus engines sit behind session-affinity routing.",
    )
    sim.add_argument(
        "--profile",
        default=None,
        help="hardware profile: a JSON file or a shipped name (default: h200-qwen3-next-2b; see "
        "flashstate/sim/profiles/)",
    )
    sim.add_argument(
        "--step-cost-scale",
        type=float,
        default=1.0,
        help="multiply the profile's step times (prefill, a prefill step's fixed cost, decode) by this; the "
        "engine's cost model stays: how far a result moves with a few percent of step cost (a run near a "
        "cliff moves further than the simulator's error)",
    )
    sim.add_argument(
        "--step-noise-seed",
        type=int,
        default=None,
        metavar="N",
        help="seed of the steps' noise (the profile's \"noise\": each step's time drawn around its price); "
        "the workload's draw stays --seed's. Runs at several seeds give a figure's spread, their median the "
        "prediction of a figure set by a few requests (a tail). Refused where there is no noise to seed (a "
        "profile without it, or --no-step-noise); default 0",
    )
    sim.add_argument(
        "--no-step-noise",
        action="store_true",
        help="every step at its modelled price (the profile's noise off)",
    )
    sim.add_argument(
        "--engine-as-of",
        default=None,
        metavar="TIME",
        help="simulate the engine as it was at TIME (UTC, as a bench result stamps `created`): the profile's "
        "host-tier call costs of then (its host.earlier); a replay of a recorded run passes the run's",
    )
    sim.add_argument(
        "--send-times",
        default=None,
        metavar="RESULT",
        help="send each turn when the recorded run RESULT (a bench result file) sent the same session's "
        "turn, or when its previous turn ends where that is later, instead of after its think time: the "
        "engine's model against the recorded arrivals, without the drift of a closed loop",
    )
    sim.add_argument(
        "--chat-unspliced-per-token",
        type=float,
        default=0.0,
        metavar="Q",
        help="chat mode: a reply of L tokens comes back re-tokenized (not as its generated ids) with chance "
        "1 - (1 - Q)^L, so the next turn leaves the cached path at its first token, as on a server before "
        "85d4391 for replies holding a special token their text hid (a replay of such a run passes the "
        "default tokenizer's share, 3/2048); default 0",
    )
    sim.add_argument(
        "--step-trace",
        action="store_true",
        help="write each run's step trace as `bench compare` keeps the server's (steps-<label>.jsonl.gz in "
        "--out: a row per step, a line per finished request; the first engine's), to set beside a card's",
    )
    compare_args(sim)
    workload_args(sim)
    replay_args(sim)
    cost_args(sim)
    sim.add_argument("--out", default=None, help="output directory (default: bench-results/<UTC time>)")


def add_fit_profile_parser(sub: argparse._SubParsersAction) -> None:
    fit = sub.add_parser(
        "fit-profile",
        help="fit a simulator profile's step model to a real server's step traces (--step-trace files)",
        description="Least-squares fit of the decode step (base + per sequence + per context token) and of "
        "C(n) = a·n + b·n² to the steps a server traced under load (`flashstate serve --step-trace`, or the "
        "steps-*.jsonl that `bench compare` writes); memory and engine flags come from --base. Writes a "
        "profile for `flashstate simulate --profile FILE`.",
    )
    fit.add_argument("traces", nargs="+", metavar="STEP_TRACE", help="step trace files (JSON lines)")
    fit.add_argument(
        "--base", default=None, help="profile for memory and engine flags (default: the H200 one)"
    )
    fit.add_argument("--name", default=None, help="the new profile's name (default: the output file's stem)")
    fit.add_argument(
        "--results",
        nargs="+",
        default=None,
        metavar="RESULT",
        help="the same runs' bench results (result-*.json), one per trace in order: fits the request "
        "overhead outside the engine and, from the runs that restored from a host tier, the tier's call "
        "costs to the engine thread (default: --base's)",
    )
    fit.add_argument(
        "--host-earlier",
        nargs="+",
        action="append",
        default=None,
        metavar=("UNTIL", "RESULT"),
        help="UNTIL RESULT...: the host tier's call costs of an engine built before the UTC time UNTIL, from "
        "those bench results (a replay of a run recorded then uses them); repeatable (default: --base's)",
    )
    fit.add_argument(
        "--keep-steps",
        action="store_true",
        help="keep --base's step model and fit only what --results give (the request overhead; for chat-mode "
        "runs also the chat template's tokens and the engine thread's time per chat prompt token)",
    )
    fit.add_argument("--out", required=True, help="profile file to write (JSON)")
