"""The simulator's error on recorded runs, and how far each simulated figure moves with the steps' noise and a
few percent of step cost: every result-<label>.json(.gz) in each RUN directory is replayed on the profile
with its own workload, trace half, engine flags and policy (flashstate/sim/recorded.py), once per
--step-noise-seed (where the profile has noise: each step's time drawn around its price) and per
--step-cost-scale. The prediction is the median over the seeds at the profile's step costs; the spread spans
every replay. A card run whose figure lies outside the simulator's error bound but inside that spread sits
where the figure is not stable (a cliff, or a tail set by a few requests), not where the model misses a
cost. The card's band is the measured figure's own 5th–95th percentile over the run's agents drawn again with
replacement (flashstate/bench/resample.py): a simulated figure inside it is as close as the run's sessions
let one card run tell.

    PYTHONPATH=. python benchmarks/sim_error.py benchmarks/results/card-2026-12-04/validate-1.0-vllm \\
        --profile h200-qwen3-next-2b-tune --traces /path/to/traces/claude-code --out bench-results/sim-error

Writes errors.json and errors.md under --out (and each simulation's results under it); prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

from flashstate.bench.report import read_result, result_files
from flashstate.bench.resample import session_bands
from flashstate.cli import main as flashstate
from flashstate.sim.profile import NO_STEP_NOISE, load_profile
from flashstate.sim.recorded import METRICS, error, median_summary, simulate_argv


def simulate(
    result: dict,
    profile: str,
    traces: str,
    scale: float,
    seed: int | None,
    out: Path,
    sent: Path | None = None,
) -> dict:
    """The simulated summary of the recorded `result` at step costs × `scale` and noise seed `seed` (None: a
    profile without noise); `sent`: its file, whose send times the replay keeps (`simulate --send-times`)."""
    argv = [*simulate_argv(result, profile, traces), "--step-cost-scale", str(scale), "--out", str(out)]
    if seed is not None:
        argv += ["--step-noise-seed", str(seed)]
    if sent is not None:
        argv += ["--send-times", str(sent)]
    with contextlib.redirect_stdout(io.StringIO()):
        if flashstate(argv) != 0:
            raise SystemExit(f"sim_error: simulate failed for {result['label']} ({' '.join(argv)})")
    return read_result(out / f"result-{result['label']}.json")["summary"]


def _fmt(name: str, value: float | None) -> str:
    if value is None:
        return "–"
    if name == "hit rate":
        return f"{value:.1%}"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _err(name: str, e: float | None) -> str:
    if e is None:
        return "–"
    return f"{e * 100:+.1f} pt" if name == "hit rate" else f"{e:+.0%}"


def _span(name: str, span: tuple[float, float] | None) -> str:
    return "–" if span is None else f"{_fmt(name, span[0])} – {_fmt(name, span[1])}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="directories of recorded bench results")
    ap.add_argument("--profile", required=True, help="simulator profile: a shipped name or a JSON file")
    ap.add_argument("--traces", required=True, help="the trace set the runs replayed")
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0], help="step-cost scales (default 1)")
    ap.add_argument(
        "--noise-seeds",
        type=int,
        default=7,
        help="replays at noise seeds 0..N-1 (one where the profile has no noise); default 7",
    )
    ap.add_argument(
        "--card-send-times",
        action="store_true",
        help="send each simulated turn when the card sent it (or when its previous turn ends, if later): the "
        "engine's model against the card's arrivals, without the closed loop's drift",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if 1.0 not in args.scales:
        ap.error("--scales must include 1 (the profile as it is: the error is read there)")
    if args.noise_seeds < 1:
        ap.error("--noise-seeds: at least 1")
    noisy = load_profile(args.profile).noise != NO_STEP_NOISE
    seeds: list[int | None] = list(range(args.noise_seeds)) if noisy else [None]
    out = Path(args.out)
    rows = []
    for run in map(Path, args.runs):
        files = result_files(run)
        if not files:
            ap.error(f"no result-*.json in {run}")
        for path in files:
            measured = read_result(path)
            label = measured["label"]
            simulated, sent = {}, path if args.card_send_times else None
            for scale in args.scales:
                for seed in seeds:
                    print(f"== {run.name} {label} x{scale:g} seed {seed}", file=sys.stderr)
                    where = out / run.name / (f"x{scale:g}" if seed is None else f"x{scale:g}-seed{seed}")
                    simulated[scale, seed] = simulate(
                        measured, args.profile, args.traces, scale, seed, where, sent
                    )
            card = {name: pick(measured["summary"]) for name, pick in METRICS.items()}
            predicted = median_summary([simulated[1.0, seed] for seed in seeds])
            errors = error(predicted, measured["summary"])
            bands = session_bands(measured, METRICS)
            for name, pick in METRICS.items():
                values = [v for s in simulated.values() if (v := pick(s)) is not None]
                span = (min(values), max(values)) if values else None
                inside = None if span is None or card[name] is None else span[0] <= card[name] <= span[1]
                band, sim = bands[name], pick(predicted)
                in_band = None if band is None or sim is None else band[0] <= sim <= band[1]
                rows.append({
                    "run": str(run), "label": label, "metric": name, "card": card[name],
                    "simulated": sim, "error": errors[name], "spread": span,
                    "card_inside_spread": inside, "card_band": band, "simulated_inside_band": in_band,
                })  # fmt: skip
    scales = ", ".join(f"{s:g}" for s in args.scales)
    sends = "; each turn sent when the card sent it" if args.card_send_times else ""
    lines = [
        f"Profile {args.profile}{sends}; simulated: the median over {len(seeds)} noise seed(s) at the "
        f"profile's step costs; error = simulated / measured − 1; spread: the simulated figure over the "
        f"seeds at step costs × {scales}; card's band: the measured figure's 5th–95th percentile over its "
        f"agents drawn again.",
        "",
        "| run | label | metric | card | simulated | error | spread | card inside | card's band | "
        "simulated inside |",
        "|---|---|---|---:|---:|---:|---|---|---|---|",
    ]
    yes_no = {None: "–", True: "yes", False: "no"}
    for r in rows:
        span, band = (_span(r["metric"], r[k]) for k in ("spread", "card_band"))
        lines.append(
            f"| {Path(r['run']).name} | {r['label']} | {r['metric']} | {_fmt(r['metric'], r['card'])} | "
            f"{_fmt(r['metric'], r['simulated'])} | {_err(r['metric'], r['error'])} | {span} | "
            f"{yes_no[r['card_inside_spread']]} | {band} | {yes_no[r['simulated_inside_band']]} |"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "errors.json").write_text(
        json.dumps(
            {
                "profile": args.profile,
                "scales": args.scales,
                "seeds": seeds,
                "card_send_times": args.card_send_times,
                "rows": rows,
            },
            indent=1,
        )
    )
    (out / "errors.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
