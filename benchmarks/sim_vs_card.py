"""Where a simulated run and the card run it replays part: a recorded `bench compare` result is simulated on
a profile with its own workload and flags (flashstate/sim/recorded.py) and `--step-trace`, and the two step
traces are set side by side over the whole run:

- the engine: steps, wall time per step (its call and the engine loop's time before it: sim/fit.py's span),
  the loop's share of it, the states a step with prefill exports (checkpoints), the running set and the
  queue over time, and the engine thread's seconds in the host tier's calls, in all and by call;
- the prefix cache's evictions by reason;
- how the profile's step model prices the card's steps (sim/fit.py's step_model_error);
- the requests both ran, matched by session and turn: their prompts' lengths, the later turns' misses, and
  where each continuation resumed (the previous turn's frontier, its prompt's end, or before it);
- the requests, by where they resumed (cold: under half the prompt cached; else a host restore or a GPU
  hit): how long they waited to be admitted (p50 / p90; to the start of the step that admitted them, since
  the card stamps an admission inside that step's scheduling and the simulator at its start), their time from
  arrival to first token on the server (p50 / p90); for host restores, how many had their state read before
  admission (read ahead while queued) and when the read landed after arrival (p50 / p90); how many
  mostly-cached ones waited over 0.2 s; how long a request stayed from admission to its end.

    C=benchmarks/results/card-2026-12-04
    PYTHONPATH=. python benchmarks/sim_vs_card.py $C/tune-0.5-flashstate-host \\
        --profile h200-qwen3-next-2b-tune --traces /path/to/traces/claude-code --out bench-results/vs

Prints a markdown table (card, simulated, simulated / card − 1); writes it to --out/vs.md with the simulation.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np

from flashstate.bench.metrics import server_sum
from flashstate.bench.report import read_result, result_files
from flashstate.bench.step_summary import read_trace
from flashstate.cli import main as flashstate
from flashstate.sim.fit import (
    STAMP_S,
    holding_step,
    loop_share,
    step_model_error,
    with_events,
    with_gaps,
)
from flashstate.sim.fit_host import CALLS, SECONDS
from flashstate.sim.profile import Profile, load_profile
from flashstate.sim.recorded import simulate_argv
from flashstate.sim.replay import session_key

SLOW_WAIT_S = 0.2


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def _kind(r: dict[str, Any]) -> str:
    """Cold when under half its prompt was cached, wherever the cached part came from (a restore that brings
    back a third of a long prompt queues as a miss does); else a host restore or a GPU hit."""
    if 2 * r["cached_tokens"] < r["prompt_tokens"]:
        return "cold"
    return "host" if r.get("fetched") is not None else "gpu"


def traced(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A step trace read once: its step rows, each with its span's gap and its admissions and finishes
    (sim/fit.py), and its request lines."""
    steps, requests = read_trace(path)
    return with_events(with_gaps(steps), requests), requests


def engine_facts(rows: list[dict[str, Any]]) -> dict[str, float]:
    spans = np.array([r["gap_ms"] + r["ms"] for r in rows])
    weighted = {}
    for key in ("running", "waiting"):  # as each step left them, over its span
        counts = np.array([r[key] for r in rows])
        weighted[f"{key}, time-weighted mean"] = float(counts @ spans / spans.sum()) if len(rows) else 0.0
    prefills = [r for r in rows if r["prefill_tokens"]]
    if not any("exports" in r for r in prefills):  # a trace from before steps counted their exports
        prefills = []
    return {
        "steps": len(rows),
        "ms per step (span)": float(spans.mean()) if len(rows) else 0.0,
        "engine loop, % of spans": 100 * loop_share(rows),
        "states exported per step with prefill": (
            sum(r.get("exports", 0) for r in prefills) / len(prefills) if prefills else None
        ),
    } | weighted


def request_facts(rows: list[dict[str, Any]], requests: list[dict[str, Any]]) -> dict[str, float | None]:
    rows = [r for r in rows if "t" in r]
    starts = [r["t"] for r in rows]

    def waited(r: dict[str, Any]) -> float:
        """Arrival to the start of the step whose call [t, t + ms) holds its admission stamp (to the stamp
        where no step does: one in the loop between steps)."""
        i = holding_step(rows, starts, r["admitted"], STAMP_S)
        return (min(starts[i], r["admitted"]) if i >= 0 else r["admitted"]) - r["arrival"]

    out: dict[str, float | None] = {}
    for kind in ("host", "gpu", "cold"):
        rs = [r for r in requests if _kind(r) == kind and r.get("first_token") is not None]
        waits = [waited(r) for r in rs]
        ttfts = [r["first_token"] - r["arrival"] for r in rs]
        out[f"{kind}: requests"] = len(rs)
        out[f"{kind}: admission wait p50 (s)"] = _pct(waits, 50)
        out[f"{kind}: admission wait p90 (s)"] = _pct(waits, 90)
        out[f"{kind}: server TTFT p50 (s)"] = _pct(ttfts, 50)
        out[f"{kind}: server TTFT p90 (s)"] = _pct(ttfts, 90)
    host = [r for r in requests if _kind(r) == "host" and r.get("first_token") is not None]
    reads = [r["fetched"] - r["arrival"] for r in host]  # a read-ahead starts when its request is queued
    out["host: read before admission"] = sum(r["fetched"] < r["admitted"] for r in host)
    out["host: arrival to read landed p50 (s)"] = _pct(reads, 50)
    out["host: arrival to read landed p90 (s)"] = _pct(reads, 90)
    cached = [r for r in requests if _kind(r) != "cold"]
    out[f"cached: waited over {SLOW_WAIT_S} s"] = sum(waited(r) > SLOW_WAIT_S for r in cached)
    done = [r["finished"] - r["admitted"] for r in requests if r.get("finished") is not None]
    out["admitted to finished, mean (s)"] = float(np.mean(done)) if done else None
    return out


def host_seconds(result: dict[str, Any]) -> dict[str, float | None]:
    """The engine thread's seconds in the host tier's calls over the run, in all and by call: a card's from
    its metrics, a simulation's from its cache stats (by call where it counted them)."""
    sim = result["server"].get("simulated")
    if sim is not None:
        stats = sim["cache_stats"]
        total: float | None = sum(s.get("host_engine_s", 0.0) for s in stats)
        by_call = [s.get("host_engine_s_by_call") for s in stats]
        counted = all(b is not None for b in by_call)
        calls = {c: sum(b.get(c, 0.0) for b in by_call) if counted else None for c in CALLS}
    else:
        delta = (result.get("server_metrics") or {}).get("delta") or {}
        total = server_sum(delta, SECONDS)
        calls = {
            c: None if total is None else server_sum(delta, SECONDS, f'call="{c}"') or 0.0 for c in CALLS
        }
    return {"host-tier calls (s)": total} | {f"host-tier calls: {c} (s)": v for c, v in calls.items()}


EVICTIONS = ("capacity_kv", "capacity_state", "spare")


def evictions(result: dict[str, Any]) -> dict[str, float | None]:
    """The prefix cache's evictions by reason over the run: a card's from its metrics, a simulation's from
    its cache stats."""
    sim = result["server"].get("simulated")
    if sim is not None:
        counts = {r: sum(s["evictions"].get(r, 0) for s in sim["cache_stats"]) for r in EVICTIONS}
    else:
        delta = (result.get("server_metrics") or {}).get("delta") or {}
        counts = {
            r: server_sum(delta, "flashstate:prefix_cache_evictions", f'reason="{r}"') or 0 for r in EVICTIONS
        }
    return {f"evictions: {r}": n for r, n in counts.items()}


def facts(result: dict[str, Any], rows: list[dict[str, Any]], requests: list[dict[str, Any]]) -> dict:
    return engine_facts(rows) | host_seconds(result) | evictions(result) | request_facts(rows, requests)


def priced(profile: Profile, rows: list[dict[str, Any]]) -> str:
    """How the profile's step model prices the card's steps (their spans less the host tier's calls)."""
    errors = step_model_error(profile, rows)
    said = ", ".join(f"{kind} {e['error']:+.1%} ({e['steps']:,} steps)" for kind, e in errors.items())
    measured = sum(e["measured_s"] for e in errors.values())
    modelled = sum(e["modelled_s"] for e in errors.values())
    return f"The profile's step model on the card's steps: {said}; all {modelled / measured - 1:+.1%}."


def matched(card: dict[str, Any], sim: dict[str, Any]) -> tuple[dict, dict]:
    """The two results' answered requests matched by session and turn, as (card's, simulated) rows: how
    many, the simulated prompt's length against the card's (median difference), and the later turns'
    uncached tokens in all and at the median."""

    def by_turn(result: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
        return {
            (session_key(r["session"]), r["turn"], r.get("depth", 0)): r
            for r in result["requests"]
            if r.get("error") is None and r.get("prompt_tokens") is not None
        }

    c, s = by_turn(card), by_turn(sim)
    common = sorted(set(c) & set(s))
    later = [k for k in common if k[1] > 0]
    uncached = [[r[k]["prompt_tokens"] - (r[k]["cached_tokens"] or 0) for k in later] for r in (c, s)]
    longer = [s[k]["prompt_tokens"] - c[k]["prompt_tokens"] for k in common]
    resumed = [{k: w for k in common if (w := _resumed(r, k)) is not None} for r in (c, s)]
    both = set(resumed[0]) & set(resumed[1])
    rows = [
        {
            "matched: requests": len(common),
            "matched: prompt tokens, simulated − card, median": _pct(longer, 50) if side else None,
            "matched: later turns' uncached tokens, all": sum(uncached[side]),
            "matched: later turns' uncached tokens, median": _pct(uncached[side], 50),
        }
        | {
            f"matched continuations: {where}": sum(resumed[side][k] == where for k in both)
            for where in RESUMED
        }
        | {
            "matched continuations: short on the card, at the frontier simulated": None
            if side
            else sum(resumed[0][k] != RESUMED[0] and resumed[1][k] == RESUMED[0] for k in both)
        }
        for side in (0, 1)
    ]
    return rows[0], rows[1]


# Where a continuation (a turn that re-sent its whole context) resumed on the cached path: at the previous
# turn's frontier (its prompt + output - 1, less a block), at that turn's prompt end (a chat turn whose
# reasoning was not re-sent), or before it (evicted, or the previous turn left nothing to resume from).
RESUMED = ("at the previous turn's frontier", "at its prompt's end", "before it")
BLOCK = 16


def _resumed(turns: dict[tuple, dict[str, Any]], key: tuple) -> str | None:
    r, prev = turns[key], turns.get((key[0], key[1] - 1, key[2]))
    if r.get("frontier") is None or prev is None:
        return None
    cached = r["cached_tokens"] or 0
    if cached >= r["frontier"] - BLOCK:
        return RESUMED[0]
    return RESUMED[1] if cached >= prev["prompt_tokens"] - 1 - BLOCK else RESUMED[2]


def _fmt(v: float | None) -> str:
    if v is None:
        return "–"
    if abs(v) < 5e-4:
        return "0"
    return f"{v:,.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:.3g}"


def table(card: dict[str, float | None], sim: dict[str, float | None]) -> str:
    lines = ["| | card | simulated | error |", "|---|---:|---:|---:|"]
    for name, want in card.items():
        got = sim.get(name)
        err = f"{got / want - 1:+.0%}" if got is not None and want else "–"
        lines.append(f"| {name} | {_fmt(want)} | {_fmt(got)} | {err} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a directory of one recorded bench result and its step trace")
    ap.add_argument("--profile", required=True, help="simulator profile: a shipped name or a JSON file")
    ap.add_argument("--traces", required=True, help="the trace set the run replayed")
    ap.add_argument(
        "--card-send-times",
        action="store_true",
        help="send each simulated turn when the card sent it (`simulate --send-times`): the engine's model "
        "against the card's arrivals",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    run, out = Path(args.run), Path(args.out)
    files = result_files(run)
    if len(files) != 1:
        ap.error(f"{run}: {len(files)} bench results (one wanted)")
    card = read_result(files[0])
    card_trace = next(run.glob(f"steps-{card['label']}.jsonl*"), None)
    if card_trace is None:
        ap.error(f"{run}: no steps-{card['label']}.jsonl(.gz): the run kept no step trace")
    argv_sim = [*simulate_argv(card, args.profile, args.traces), "--step-trace", "--out", str(out)]
    if args.card_send_times:
        argv_sim += ["--send-times", str(files[0])]
    with contextlib.redirect_stdout(io.StringIO()):
        if flashstate(argv_sim) != 0:
            raise SystemExit(f"sim_vs_card: simulate failed ({' '.join(argv_sim)})")
    sim = read_result(out / f"result-{card['label']}.json")
    card_rows, card_requests = traced(card_trace)
    sim_rows, sim_requests = traced(out / f"steps-{card['label']}.jsonl.gz")
    by_turn = matched(card, sim)
    text = table(
        facts(card, card_rows, card_requests) | by_turn[0], facts(sim, sim_rows, sim_requests) | by_turn[1]
    )
    text += "\n\n" + priced(load_profile(args.profile), card_rows)
    sends = ", the card's send times" if args.card_send_times else ""
    title = f"{run.name} on {args.profile} (whole run{sends})"
    (out / "vs.md").write_text(f"# {title}\n\n{text}\n")
    print(f"{title}\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
