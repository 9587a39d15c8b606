"""Results: one JSON document per run, a side-by-side markdown table over runs, PNG plots (matplotlib Agg).

Result JSON (`schema: flashstate.bench.result/1`):

    label            the policy (compare) or "run"
    created          ISO time;  server {base_url, model, max_model_len, command}
    workload         {kind: synthetic|agentx|mooncake, source, sessions, seed, ...}
    scale            {length_scale, length_scale_auto, max_context, time_scale, max_think_s,
                      max_output_tokens}
    replay           ReplayConfig as run (agents, warmup_s, duration_s, mode, ...)
    summary          metrics.summarize over the measured window (`bench report --whole-run`: over the
                     whole run, with `window: "whole run"` set)
    cost             cost.cost_view
    server_metrics   {before, after, delta} of /metrics samples (None: no /metrics), and
                     cross_check {client_cached_tokens, server_cached_tokens, equal}
    timeline         {bucket_s, output_tokens[], window [start, end]}
    requests[], sessions[]   the per-request and per-session records
    rounds           (compare --rounds N > 1) every round's {summary, cost}, the first round's being the
                     document's own; the markdown gives each metric's median over them and its spread

A compare report (`schema: flashstate.bench.compare/1`) holds {created, reference, policies, results{}}, the
results without their per-request and per-session records (those stay in result-<policy>.json).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any

from flashstate.bench.cost import Prices, cost_view
from flashstate.bench.files import read_text
from flashstate.bench.metrics import (
    RequestRecord,
    SessionRecord,
    metrics_delta,
    output_timeline,
    server_sum,
    summarize,
)
from flashstate.bench.replay import ReplayResult

RESULT_SCHEMA = "flashstate.bench.result/1"
COMPARE_SCHEMA = "flashstate.bench.compare/1"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def build_result(
    run: ReplayResult,
    label: str,
    workload: dict[str, Any],
    scale: dict[str, Any],
    prices: Prices,
    server: dict[str, Any] | None = None,
) -> dict[str, Any]:
    cfg = run.config
    start = cfg["warmup_s"]
    end = max(start, min(start + cfg["duration_s"], run.stopped_s))
    summary = summarize(run.requests, run.sessions, start, end, cfg["num_gpus"])
    summary["cut_requests"] = run.cut_requests
    metrics = None
    if run.server_before is not None and run.server_after is not None:
        delta = metrics_delta(run.server_before, run.server_after)
        server_cached = server_sum(delta, "vllm:prefix_cache_hits")
        metrics = {
            "before": run.server_before,
            "after": run.server_after,
            "delta": delta,
            "cross_check": {
                "client_cached_tokens": summary["run_cached_tokens"],
                "server_cached_tokens": server_cached,
                "equal": server_cached is not None and server_cached == summary["run_cached_tokens"],
            },
        }
    bucket = max(1.0, run.wall_s / 100)
    return {
        "schema": RESULT_SCHEMA,
        "label": label,
        "created": _now(),
        "server": {"base_url": cfg["base_url"], "model": run.model, "max_model_len": run.max_model_len}
        | (server or {}),
        "workload": workload,
        "scale": scale | {"max_context": run.max_context},
        "replay": cfg,
        "wall_s": run.wall_s,
        "summary": summary,
        "cost": cost_view(run.requests, run.sessions, start, end, prices, cfg["num_gpus"]),
        "server_metrics": metrics,
        "client_gc": run.client_gc,
        "timeline": {
            "bucket_s": bucket,
            "output_tokens": output_timeline(run.requests, run.wall_s, bucket),
            "window": [start, end],
        },
        "requests": [r.as_dict() for r in run.requests],
        "sessions": [s.as_dict() for s in run.sessions],
    }


def over_whole_run(result: dict[str, Any]) -> dict[str, Any]:
    """The result read over the whole run instead of its window: every request from the first send to the
    drain's end, warm-up included, by the same rule for every run. For runs whose window holds too few
    answered requests to read (a real-size model's re-prefills take minutes each)."""
    requests = [RequestRecord(**d) for d in result["requests"]]
    sessions = [SessionRecord(**d) for d in result["sessions"]]
    end, gpus = result["wall_s"], result["replay"].get("num_gpus", 1)
    summary = summarize(requests, sessions, 0.0, end, gpus)
    summary["cut_requests"] = result["summary"].get("cut_requests")
    doc = {k: v for k, v in result.items() if k != "rounds"}  # rounds keep only their windows' summaries
    return doc | {
        "window": "whole run",
        "summary": summary,
        "cost": cost_view(requests, sessions, 0.0, end, Prices(**result["cost"]["prices"]), gpus),
        "timeline": result["timeline"] | {"window": [0.0, end]},
    }


def read_result(path: Path) -> dict[str, Any]:
    """A result-<label>.json, or gzipped (as benchmarks/results keeps them)."""
    return json.loads(read_text(path))


def result_files(given: Path) -> list[Path]:
    """A result file, or a run directory's result files (result-*.json, or gzipped) in its compare.json's
    order (else by name)."""
    if not given.is_dir():
        return [given]
    files = sorted([*given.glob("result-*.json"), *given.glob("result-*.json.gz")])
    compare = given / "compare.json"
    if compare.exists():
        order = json.loads(compare.read_text()).get("policies", [])
        rank = {f"result-{p}.json": i for i, p in enumerate(order)}
        files.sort(key=lambda f: rank.get(f.name.removesuffix(".gz"), len(rank)))
    return files


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


# ---------------------------------------------------------------------------------------------------
# markdown


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}g}"


def _money(x: float | None) -> str:
    return "–" if x is None else f"${x:,.4f}"


# (row name, getter, formatter, lower is better)
ROWS = [
    ("token hit rate", lambda r: r["summary"]["token_hit_rate"], _pct, False),
    (
        "uncached tokens / request p50",
        lambda r: r["summary"]["uncached_tokens_per_request"]["p50"],
        _num,
        True,
    ),
    (
        "uncached tokens / request p90",
        lambda r: r["summary"]["uncached_tokens_per_request"]["p90"],
        _num,
        True,
    ),
    ("TTFT p50 (s)", lambda r: r["summary"]["ttft_s"]["p50"], _num, True),
    ("TTFT p90 (s)", lambda r: r["summary"]["ttft_s"]["p90"], _num, True),
    ("TTFT p99 (s)", lambda r: r["summary"]["ttft_s"]["p99"], _num, True),
    ("e2e p50 (s)", lambda r: r["summary"]["e2e_s"]["p50"], _num, True),
    ("output TPM", lambda r: r["summary"]["output_tpm"], _num, False),
    ("completed agents", lambda r: r["summary"]["completed_agents"], _num, False),
    ("requests", lambda r: r["summary"]["requests"], _num, False),
    ("prefill tokens / min / GPU", lambda r: r["summary"]["prefill_tpm_per_gpu"], _num, True),
    (
        "continuations short of frontier",  # re-sent its whole context, got less than prompt + output
        lambda r: r["summary"].get("diverged_before_frontier"),
        _num,
        True,
    ),
    ("tokens short of frontier", lambda r: r["summary"].get("tokens_short_of_frontier"), _num, True),
    ("GPU-s / completed agent", lambda r: r["cost"]["gpu_seconds_per_completed_agent"], _num, True),
    (
        "provider cost / completed agent",
        lambda r: r["cost"]["provider_cost_per_completed_agent"],
        _money,
        True,
    ),
    ("user bill / session", lambda r: r["cost"]["user_bill_per_session"], _money, True),
    ("user bill / request", lambda r: r["cost"]["user_bill_per_request"], _money, True),
    ("provider profit / GPU-hour", lambda r: r["cost"]["provider_profit_per_gpu_hour"], _money, False),
    ("errors", lambda r: r["summary"]["errors"], _num, True),
]


def round_values(result: dict[str, Any], get) -> list[float]:
    """The metric in each of the run's rounds (its one value without `rounds`), unknowns left out."""
    docs = result.get("rounds") or [result]
    return [v for v in (get(d) for d in docs) if v is not None]


def median_value(result: dict[str, Any], get) -> float | None:
    values = round_values(result, get)
    return statistics.median(values) if values else None


def ratio(value: float | None, ref: float | None, lower_is_better: bool) -> float | None:
    """How many times better `value` is than `ref` (> 1: better)."""
    if value is None or ref is None:
        return None
    if lower_is_better:
        return ref / value if value else None
    return value / ref if ref else None


def _ratio_cell(result: dict[str, Any], reference: dict[str, Any], get, lower: bool) -> str:
    c = ratio(median_value(result, get), median_value(reference, get), lower)
    if c is None:
        return "–"
    a, b = round_values(result, get), round_values(reference, get)
    overlap = len(a) > 1 and len(b) > 1 and min(a) <= max(b) and min(b) <= max(a)
    return f"{c:.2f}× *within spread*" if overlap else f"{c:.2f}×"


def markdown(results: dict[str, dict[str, Any]], reference: str | None = None, title: str = "") -> str:
    labels = list(results)
    first = results[labels[0]]
    scale, replay, workload = first["scale"], first["replay"], first["workload"]
    lines = [f"# {title or 'flashstate bench'}", ""]
    window = f"warm-up {replay['warmup_s']:g} s, window {replay['duration_s']:g} s"
    if first.get("window") == "whole run":
        window = (f"read over the whole run (every request from the first send to the drain's end, the "
                  f"{replay['warmup_s']:g} s warm-up included)")  # fmt: skip
    lines.append(
        f"Workload: {workload.get('kind')} ({workload.get('source')}), seed {replay['seed']}; "
        f"{replay['agents']} agents, {replay['mode']} mode, {window}. "
        f"Server model {first['server'].get('model')}."
    )
    lines.append(
        f"Scale: length × {scale['length_scale']:.4g}{' (auto)' if scale.get('length_scale_auto') else ''}, "
        f"max context {scale.get('max_context')}, time × {scale['time_scale']:g}, "
        f"think cap {scale.get('max_think_s')}, output cap {scale.get('max_output_tokens')}."
    )
    rounds = max(len(r.get("rounds") or [r]) for r in results.values())
    if rounds > 1:
        lines.append(
            f"Each server ran {rounds} times, the order reversed each round; every figure is the median over "
            "the rounds."
        )
    lines += ["", "| metric | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name, get, fmt, _ in ROWS:
        lines.append(f"| {name} | " + " | ".join(fmt(median_value(results[k], get)) for k in labels) + " |")
    others = [k for k in labels if k != reference]
    if reference in results and others:
        lines += ["", f"Times better than `{reference}` (> 1: better; lower-is-better metrics inverted):", ""]
        if rounds > 1:
            lines += ["(*within spread*: the two runs' ranges over the rounds overlap — a difference the "
                      "machine's own variation can explain.)", ""]  # fmt: skip
        lines += ["| metric | " + " | ".join(others) + " |", "|---|" + "---:|" * len(others)]
        for name, get, _, lower in ROWS[:11]:
            cells = [_ratio_cell(results[k], results[reference], get, lower) for k in others]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if rounds > 1:
        lines += ["", "Spread over the rounds (min – max):", ""]
        lines += ["| metric | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
        for name, get, fmt, _ in ROWS[:8]:
            spans = [round_values(results[k], get) for k in labels]
            cells = [f"{fmt(min(v))} – {fmt(max(v))}" if v else "–" for v in spans]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    checks = [
        f"{k}: client {r['server_metrics']['cross_check']['client_cached_tokens']} / server "
        f"{r['server_metrics']['cross_check']['server_cached_tokens']}"
        for k, r in results.items()
        if r.get("server_metrics")
    ]
    if checks:
        lines += ["", "Cached tokens, client vs server /metrics (whole run): " + "; ".join(checks) + "."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# plots


def plots(results: dict[str, dict[str, Any]], out_dir: Path) -> list[Path]:
    """hit_rate.png, ttft_cdf.png, output_tokens.png in `out_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    out_dir.mkdir(parents=True, exist_ok=True)
    labels = list(results)
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    hit = [results[k]["summary"]["token_hit_rate"] or 0.0 for k in labels]
    unc = [results[k]["summary"]["uncached_tokens_per_request"]["p50"] or 0.0 for k in labels]
    axes[0].bar(labels, [100 * h for h in hit], color="tab:blue")
    axes[0].set_ylabel("token hit rate (%)")
    axes[0].set_ylim(0, 100)
    axes[1].bar(labels, unc, color="tab:orange")
    axes[1].set_ylabel("median uncached tokens / request")
    for ax, values, fmt in ((axes[0], [100 * h for h in hit], "{:.1f}%"), (axes[1], unc, "{:,.0f}")):
        for i, v in enumerate(values):
            ax.annotate(fmt.format(v), (i, v), ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "hit_rate.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for k in labels:
        start, end = results[k]["timeline"]["window"]
        ttft = sorted(
            r["ttft"]
            for r in results[k]["requests"]
            if r["error"] is None and r["ttft"] is not None and start <= r["t_send"] < end
        )
        if ttft:  # a run of a few requests draws them as points too (one alone draws no line)
            ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=k, drawstyle="steps-post",
                    marker="o" if len(ttft) < 10 else None)  # fmt: skip
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    else:  # no request of any run was answered in its window
        ax.text(0.5, 0.5, "no request answered in the window", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    paths.append(out_dir / "ttft_cdf.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for k in labels:
        tl = results[k]["timeline"]
        t = np.arange(1, len(tl["output_tokens"]) + 1) * tl["bucket_s"]
        ax.plot(t, np.cumsum(tl["output_tokens"]), label=k)
    start, end = results[labels[0]]["timeline"]["window"]
    ax.axvspan(start, end, color="grey", alpha=0.1, label="measured window")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("output tokens (cumulative)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "output_tokens.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def write_report(
    out_dir: Path, results: dict[str, dict[str, Any]], reference: str | None = None, title: str = ""
) -> dict[str, Path]:
    """result-<label>.json per run, compare.json when several, report.md, the plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {f"result-{k}": write_json(out_dir / f"result-{k}.json", r) for k, r in results.items()}
    if len(results) > 1:
        slim = {
            k: {f: v for f, v in r.items() if f not in ("requests", "sessions")} for k, r in results.items()
        }
        doc = {
            "schema": COMPARE_SCHEMA,
            "created": _now(),
            "reference": reference,
            "policies": list(results),
            "results": slim,
        }
        files["compare"] = write_json(out_dir / "compare.json", doc)
    files["report"] = out_dir / "report.md"
    files["report"].write_text(markdown(results, reference, title))
    for p in plots(results, out_dir):
        files[p.stem] = p
    return files
