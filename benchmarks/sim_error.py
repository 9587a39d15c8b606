"""The simulator's error on recorded runs, and how far each simulated figure moves with a few percent of step
cost: every result-<label>.json(.gz) in each RUN directory is replayed on the profile with its own workload,
trace half, engine flags and policy (flashstate/sim/recorded.py), once per --step-cost-scale. A card run
whose figure lies outside the simulator's error bound but inside that spread sits where the figure is not
stable (a cliff, or a tail set by a few requests), not where the model misses a cost.

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
from flashstate.cli import main as flashstate
from flashstate.sim.recorded import METRICS, error, simulate_argv


def simulate(result: dict, profile: str, traces: str, scale: float, out: Path) -> dict:
    """The simulated summary of the recorded `result` at step costs × `scale`."""
    argv = [*simulate_argv(result, profile, traces), "--step-cost-scale", str(scale), "--out", str(out)]
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="directories of recorded bench results")
    ap.add_argument("--profile", required=True, help="simulator profile: a shipped name or a JSON file")
    ap.add_argument("--traces", required=True, help="the trace set the runs replayed")
    ap.add_argument("--scales", type=float, nargs="+", default=[0.97, 0.99, 1.0, 1.01, 1.03])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if 1.0 not in args.scales:
        ap.error("--scales must include 1 (the profile as it is: the error is read there)")
    out = Path(args.out)
    rows = []
    for run in map(Path, args.runs):
        files = result_files(run)
        if not files:
            ap.error(f"no result-*.json in {run}")
        for path in files:
            measured = read_result(path)
            label = measured["label"]
            simulated = {}
            for scale in args.scales:
                print(f"== {run.name} {label} x{scale:g}", file=sys.stderr)
                simulated[scale] = simulate(
                    measured, args.profile, args.traces, scale, out / run.name / f"x{scale:g}"
                )
            card = {name: pick(measured["summary"]) for name, pick in METRICS.items()}
            sims = {name: [pick(s) for s in simulated.values()] for name, pick in METRICS.items()}
            errors = error(simulated[1.0], measured["summary"])
            for name in METRICS:
                values = [v for v in sims[name] if v is not None]
                span = (min(values), max(values)) if values else None
                inside = None if span is None or card[name] is None else span[0] <= card[name] <= span[1]
                rows.append({
                    "run": str(run), "label": label, "metric": name, "card": card[name],
                    "simulated": METRICS[name](simulated[1.0]), "error": errors[name], "spread": span,
                    "card_inside_spread": inside,
                })  # fmt: skip
    scales = ", ".join(f"{s:g}" for s in args.scales)
    lines = [
        f"Profile {args.profile}; error = simulated / measured − 1 at the profile's step costs; spread: the "
        f"simulated figure at step costs × {scales}.",
        "",
        "| run | label | metric | card | simulated | error | spread | card inside |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        span = (
            "–"
            if r["spread"] is None
            else f"{_fmt(r['metric'], r['spread'][0])} – {_fmt(r['metric'], r['spread'][1])}"
        )
        inside = {None: "–", True: "yes", False: "no"}[r["card_inside_spread"]]
        lines.append(
            f"| {Path(r['run']).name} | {r['label']} | {r['metric']} | {_fmt(r['metric'], r['card'])} | "
            f"{_fmt(r['metric'], r['simulated'])} | {_err(r['metric'], r['error'])} | {span} | {inside} |"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "errors.json").write_text(
        json.dumps({"profile": args.profile, "scales": args.scales, "rows": rows}, indent=1)
    )
    (out / "errors.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
