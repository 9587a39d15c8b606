"""A hardware profile's performance model fitted from measured engine steps (`--step-trace` files of a real
server under load), so the simulator prices steps as that engine ran them.

Rows without prefill tokens fit the decode step, ms = base + per_seq · B + per_token · T (B decoding
sequences holding T tokens) + finish_s · F (F requests the step finished). Rows with prefill fit
C(n) = a·n + b·n² through what is left after their decoding rows: a chunk of n tokens resuming at depth p
costs a·n + b·((p + n)² − p²), and the trace's `prefill_tokens` and `prefill_pairs` are those two sums,
plus a fixed cost per step: step_s for an eager step and, where the trace marks some steps `graphed`
(replayed as a mixed-step CUDA graph) and not others, graphed_step_s for those, plus admit_s per request
the step admitted. A step's admissions and finishes are read off the trace's request lines (`admitted`,
`finished` stamped inside it: read_steps' `admitted`, `finished`). Least squares with non-negative
coefficients (a term whose weight would go negative is dropped and the rest refitted).

A step's time is its span: from the end of the traced step before it (where that one left requests running
or waiting, so the engine loop went straight on) to its own end. Between two step calls the engine loop
delivers the outputs and adds the requests that arrived (under memory admission, each one's cached depth is
looked up then, in the GPU tree and the host tier): the simulator runs its steps back to back, so that time
is the steps' (read_steps' `gap_ms`; `fit-profile` prints its share). A trace of a server with a host tier
gives each step the engine thread's time inside the tier's calls since the step before ended (`host_ms`,
the look-ups of that gap included), which is taken out, since the simulator charges those calls one by one
at their measured rates (sim/host.py) and a policy without a tier makes none.

How far the steps stray from the fitted price (profile "noise", fit_noise): the spread of log(measured /
modelled) over the steps with prefill, and over pure-decode steps taken two at a time (a decode step's span
shares time with its neighbour's under async scheduling: one running long leaves the next short, their
residuals correlate −0.3 on the H200 runs), scaled back to one step.

A request's overhead outside the engine (profile "request") is fitted from the same runs' bench results:
each client record is paired with the server's request line of the same prompt and cached length (pairs
unique on both sides), and the client's TTFT less the server's (arrival to first token) is fitted as
overhead_s + overhead_per_token_s · prompt tokens, leaving out the slowest 5% (stalls: a compile, a
collection, and the most crowded arrivals): the cost of a request prepared alone, which a chat replay
shares among the prompts prepared at once (sim/shared_cpu.py). From chat-mode runs, the profile's "chat"
section too (fit_chat_costs): the tokens the server's template adds to the text sent, and the engine
thread's time per prompt token that a chat request costs while the server renders and tokenizes it.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from flashstate.bench.files import read_text
from flashstate.sim.profile import PROFILE_SCHEMA, Profile

Rows = list[dict[str, Any]]
NEEDED = ("ms", "prefill_tokens", "decode_seqs", "prefill_pairs", "decode_context")


def _lines(path: Path) -> list[str]:
    try:
        text = read_text(path)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    return text.splitlines()


def read_request_lines(path: Path) -> list[dict[str, Any]]:
    """The request lines of a step trace (those with a first token)."""
    rows = (json.loads(line) for line in _lines(path) if '"request"' in line)
    return [r for r in rows if "request" in r and r.get("first_token") is not None]


OVERHEAD_KEPT = 0.95  # the share of paired requests the overhead fit keeps (the fastest)


def pair_requests(
    server: list[dict[str, Any]], client: list[dict[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(client record, server request line) of the same prompt and cached length, where that pair of
    lengths occurs once on each side."""

    def key(r: dict[str, Any]) -> tuple[int, int]:
        return r["prompt_tokens"], r["cached_tokens"]

    client = [r for r in client if r.get("error") is None and r.get("ttft") is not None]
    by_key: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in server:
        by_key.setdefault(key(r), []).append(r)
    counts: dict[tuple[int, int], int] = {}
    for r in client:
        counts[key(r)] = counts.get(key(r), 0) + 1
    pairs = []
    for r in client:
        match = by_key.get(key(r), ())
        if counts[key(r)] == 1 and len(match) == 1:  # the same sizes twice on either side: ambiguous
            pairs.append((r, match[0]))
    return pairs


def outside_engine_s(pair: tuple[dict[str, Any], dict[str, Any]]) -> float:
    """A paired request's TTFT at the client less its server's (arrival to first token)."""
    c, s = pair
    return c["ttft"] - (s["first_token"] - s["arrival"])


def fit_request_overhead(server: list[dict[str, Any]], client: list[dict[str, Any]]) -> dict[str, Any]:
    """{"overhead_s", "overhead_per_token_s", "pairs"} from a run's server request lines and its bench
    result's request records (module docstring); ValueError when fewer than 20 pair up."""
    pairs = [(c["prompt_tokens"], outside_engine_s((c, s))) for c, s in pair_requests(server, client)]
    if len(pairs) < 20:
        raise ValueError(f"only {len(pairs)} requests pair up between the traces and the results")
    tokens, extra = np.array(pairs, dtype=float).T
    kept = extra <= np.quantile(extra, OVERHEAD_KEPT)
    x = np.stack([np.ones(int(kept.sum())), tokens[kept]], axis=1)
    base, per_token = _nonneg_lstsq(x, extra[kept])
    return {"overhead_s": float(base), "overhead_per_token_s": float(per_token), "pairs": len(pairs)}


def read_steps(paths: list[Path]) -> list[dict[str, Any]]:
    """The rows of step trace files, each with its `gap_ms` (with_gaps) and its `admitted` and `finished`
    (with_events); ValueError naming the file when one is unreadable or too old."""
    rows = []
    for path in paths:
        start, requests = len(rows), []
        for i, line in enumerate(_lines(path), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{i}: not a JSON line") from None
            if "request" in row:  # a request's line, not a step
                requests.append(row)
                continue
            missing = [k for k in NEEDED if k not in row]
            if missing:
                raise ValueError(
                    f"{path}:{i}: a step row without {', '.join(missing)} (a trace from an older server)"
                )
            rows.append(row)
        with_gaps(rows[start:])
        with_events(rows[start:], requests)
    return rows


# request lines' stamps and a row's start are rounded to the microsecond
STAMP_S = 2e-6


def with_events(rows: list[dict[str, Any]], requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sets each of one trace's step `rows` its `admitted` and `finished`: the trace's requests (its request
    lines) admitted and finished inside the step's call, [start, end) and (start, end] (steps run back to
    back: a request admitted as one starts, or finished as one ends, counts once). A row already carrying
    them keeps them."""
    admitted = sorted(r["admitted"] for r in requests if r.get("admitted") is not None)
    finished = sorted(r["finished"] for r in requests if r.get("finished") is not None)
    for row in rows:
        if "t" not in row:
            continue
        start, end = row["t"], row["t"] + row["ms"] / 1e3
        if "admitted" not in row:
            lo, hi = start - STAMP_S, end - STAMP_S
            row["admitted"] = bisect.bisect_left(admitted, hi) - bisect.bisect_left(admitted, lo)
        if "finished" not in row:
            lo, hi = start + STAMP_S, end + STAMP_S
            row["finished"] = bisect.bisect_right(finished, hi) - bisect.bisect_right(finished, lo)
    return rows


def holding_step(rows: list[dict[str, Any]], starts: list[float], t: float, slack: float = 0.0) -> int:
    """The index of the step row whose call [start, start + ms] holds time `t` (to within `slack` at either
    end), or -1 where none does: before the first step, or in the engine loop between two. `starts`: the
    rows' `t`, ascending."""
    i = bisect.bisect_right(starts, t + slack) - 1
    return i if i >= 0 and t <= starts[i] + rows[i]["ms"] / 1e3 + slack else -1


def with_gaps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sets each of one trace's step `rows` its `gap_ms`: the engine loop's time from the end of the row
    before to its own start, where that row left requests running or waiting (else the loop may have idled:
    0, as for the first row). A row already carrying `gap_ms` keeps it."""
    prev = None
    for row in rows:
        if "gap_ms" not in row:
            busy = prev is not None and "t" in row and prev.get("running", 0) + prev.get("waiting", 0) > 0
            row["gap_ms"] = max(1e3 * (row["t"] - prev["t"]) - prev["ms"], 0.0) if busy else 0.0
        prev = row
    return rows


def loop_share(rows: list[dict[str, Any]]) -> float:
    """The engine loop's share of the steps' spans: their `gap_ms` over gap_ms + ms, all rows together."""
    gaps = sum(r.get("gap_ms", 0.0) for r in rows)
    total = gaps + sum(r["ms"] for r in rows)
    return gaps / total if total > 0 else 0.0


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    keep = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        if keep:
            coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        negative = [j for j in keep if coef[j] < 0]
        if not negative:
            return coef
        keep.remove(min(negative, key=lambda j: coef[j]))


def _r2(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> float:
    residual = y - x @ coef
    total = ((y - y.mean()) ** 2).sum()
    return float(1 - (residual**2).sum() / total) if total > 0 else 1.0


def _span_seconds(row: dict[str, Any]) -> float:
    """A traced step's span: the engine loop's time before it (`gap_ms`) and its own."""
    return (row.get("gap_ms", 0.0) + row["ms"]) / 1e3


def _own_seconds(row: dict[str, Any]) -> float:
    """A traced step's span less the engine thread's time inside the host tier's calls."""
    return _span_seconds(row) - row.get("host_ms", 0.0) / 1e3


def fit_steps(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """{"decode": {base_s, per_seq_s, per_token_s}, "prefill": {a, b, step_s}, "fit": quality and counts}.
    A step with prefill costs step_s + a·tokens + b·pairs over its decode rows' modelled time."""
    decode_rows = [r for r in rows if not r["prefill_tokens"] and r["decode_seqs"]]
    prefill_rows = [r for r in rows if r["prefill_tokens"]]
    if len(decode_rows) < 3 or len(prefill_rows) < 2:
        raise ValueError(
            f"too few steps to fit: {len(decode_rows)} pure-decode (need 3) and {len(prefill_rows)} with "
            "prefill (need 2)"
        )
    x = np.array([[1.0, r["decode_seqs"], r["decode_context"], r.get("finished", 0)] for r in decode_rows])
    y = np.array([_own_seconds(r) for r in decode_rows])
    coef = _nonneg_lstsq(x, y)
    base, per_seq, per_token, finish = (float(c) for c in coef)
    decode_r2 = _r2(x, y, coef)

    def decode(r: dict[str, Any]) -> float:
        done = finish * r.get("finished", 0)
        if not r["decode_seqs"]:
            return done
        return base + per_seq * r["decode_seqs"] + per_token * r["decode_context"] + done

    # a fixed cost per kind of step: eager, and (where the trace has both) replayed as a mixed-step graph
    graphed = [bool(r.get("graphed")) for r in prefill_rows]
    split = any(graphed) and not all(graphed)
    x = np.array(
        [
            [
                *([float(not g), float(g)] if split else [1.0]),
                r["prefill_tokens"],
                r["prefill_pairs"],
                r.get("admitted", 0),
            ]
            for g, r in zip(graphed, prefill_rows, strict=True)
        ]
    )
    y = np.array([_own_seconds(r) - decode(r) for r in prefill_rows])
    coef = _nonneg_lstsq(x, y)
    *steps, a, b, admit = (float(c) for c in coef)
    prefill = {"a": a, "b": b, "step_s": steps[0]} | ({"graphed_step_s": steps[1]} if split else {})
    return {
        "decode": {"base_s": base, "per_seq_s": per_seq, "per_token_s": per_token},
        "prefill": prefill,
        "events": {"admit_s": admit, "finish_s": finish},
        "fit": {
            "decode_steps": len(decode_rows),
            "decode_r2": decode_r2,
            "prefill_steps": len(prefill_rows),
            "prefill_graphed_steps": sum(graphed),
            "prefill_r2": _r2(x, y, coef),
            "loop_share": loop_share(rows),
        },
    }


def _base_steps(base: Profile) -> dict[str, Any]:
    """`base`'s step model in fit_steps' form."""
    prefill = {"a": base.prefill.a, "b": base.prefill.b, "step_s": base.prefill_step_s}
    if base.graphed_step_s is not None:
        prefill |= {"graphed_step_s": base.graphed_step_s, "graphed_max_exports": base.graphed_max_exports}
    d = base.decode
    return {
        "prefill": prefill,
        "decode": {"base_s": d.base_s, "per_seq_s": d.per_seq_s, "per_token_s": d.per_token_s},
        "events": asdict(base.events),
    }


def fitted_profile(
    base: Profile,
    rows: list[dict[str, Any]],
    name: str,
    sources: list[str],
    overhead: dict[str, Any] | None = None,
    keep_steps: bool = False,
    host: tuple[dict[str, float], str] | None = None,
    earlier: list[tuple[str, dict[str, float], str]] | None = None,
) -> dict[str, Any]:
    """`base`'s memory and engine flags with the step model fitted from `rows` (`keep_steps`: base's), the
    request overhead `overhead` from fit_request_overhead (with the replay "mode" of the runs it was fitted
    on; else base's), the host tier's call costs `host` from fit_host_calls (else base's) and, for engines
    built before a time, `earlier` ((until, costs, what they were measured on), ascending; else base's), and
    base's chat costs (fit_chat_costs replaces them): a profile document."""
    fit = _base_steps(base) if keep_steps else fit_steps(rows)
    o, c = base.request_overhead, base.chat_request_overhead
    request = {"overhead_s": o.base_s, "overhead_per_token_s": o.per_token_s}
    if c is not None:
        request |= {"chat_overhead_s": c.base_s, "chat_overhead_per_token_s": c.per_token_s}
    said = f"profile {base.name}"
    if overhead is not None:  # fitted on runs of one mode: that mode's terms
        prefix = "chat_" if overhead.get("mode") == "chat" else ""
        request |= {prefix + k: overhead[k] for k in ("overhead_s", "overhead_per_token_s")}
        said = f"{overhead['pairs']} requests paired with their bench results ({prefix or 'token '}mode)"
    return {
        "schema": PROFILE_SCHEMA,
        "name": name,
        "device": base.device,
        "model": base.model,
        "dtype": base.dtype,
        "memory": {"cache_bytes": base.cache_bytes, "host_bytes": base.host_bytes},
        "engine_args": list(base.engine_args),
        "prefill": fit["prefill"],
        "decode": fit["decode"],
        "events": fit["events"],
        "request": request,
        "chat": asdict(base.chat),
        # what the tier's calls cost the engine thread is measured apart from the steps
        "host": {"calls_in_steps": base.host_calls_in_steps if keep_steps else False}
        | asdict(base.host_calls)
        | (host[0] if host else {})
        | _earlier(base, earlier),
        "provenance": f"{_steps_said(fit, sources, base)}; request overhead from {said}; "
        + (f"{host[1]}; " if host else "")
        + "".join(f"for engines built before {until}, {what}; " for until, _, what in earlier or [])
        + f"memory and engine flags from profile {base.name}",
    }


def _earlier(base: Profile, given: list[tuple[str, dict[str, float], str]] | None) -> dict[str, Any]:
    """The call costs for engines built before a time, in the profile's "host.earlier" form: `given`, else
    `base`'s."""
    if given is not None:
        entries = [{"until": until} | costs for until, costs, _ in given]
    else:
        entries = [{"until": until.isoformat()} | asdict(calls) for until, calls in base.earlier_host_calls]
    return {"earlier": entries} if entries else {}


def _steps_said(fit: dict[str, Any], sources: list[str], base: Profile) -> str:
    """Where a profile's step model comes from, for its provenance."""
    if "fit" not in fit:
        return f"step model of profile {base.name}"
    q = fit["fit"]
    return (
        f"fitted by `flashstate fit-profile` from {q['decode_steps']} pure-decode steps "
        f"(R2 {q['decode_r2']:.2f}) and {q['prefill_steps']} steps with prefill, "
        f"{q['prefill_graphed_steps']} of them graphed (R2 {q['prefill_r2']:.2f}) of {', '.join(sources)}, "
        f"each step's span (the engine loop's time before it included: {100 * q['loop_share']:.1f}% of the "
        "spans) less its host-tier calls"
    )


def fit_chat_costs(profile: Profile, traces: list[tuple[Rows, Rows]], client: Rows) -> dict[str, float]:
    """The profile's "chat" section from chat-mode runs: `traces` holds each run's (step rows, request lines),
    `client` the runs' bench request records.

    Template: a prompt's tokens on the server less the tokens of text sent, fitted as header_tokens +
    text_share · sent + 2 · per_message_tokens · turn (each turn adds an answer and a new message).
    Engine thread: each step's span less its host-tier calls and the profile's price, fitted as k + c ·
    (prompt tokens of the requests reaching the engine during the span) + d · (requests the step admits);
    c is engine_per_token_s, d engine_per_admit_s."""
    done = [r for r in client if r.get("error") is None and r.get("sent_tokens") is not None]
    if len(done) < 20:
        raise ValueError(f"chat costs: only {len(done)} answered requests in the results")
    x = np.array([[1.0, r["sent_tokens"], r["turn"]] for r in done])
    added = np.array([r["prompt_tokens"] - r["sent_tokens"] for r in done])
    header, share, per_turn = _nonneg_lstsq(x, added)
    xs, ys = [], []
    for steps, requests in traces:
        arrivals = sorted((r["arrival"], r["prompt_tokens"]) for r in requests)
        times = [t for t, _ in arrivals]
        reached = np.concatenate([[0.0], np.cumsum([n for _, n in arrivals])])
        for r in steps:
            start = r["t"] - r.get("gap_ms", 0.0) / 1e3
            lo, hi = bisect.bisect_left(times, start), bisect.bisect_left(times, r["t"] + r["ms"] / 1e3)
            xs.append([1.0, reached[hi] - reached[lo], r.get("admitted", 0)])
            ys.append(_own_seconds(r) - _modelled(profile, r))
    if not xs:
        raise ValueError("chat costs: no steps in the traces")
    _, engine, admit = _nonneg_lstsq(np.array(xs), np.array(ys))
    return {
        "header_tokens": round(float(header)),
        "per_message_tokens": float(per_turn) / 2,
        "text_share": float(share),
        "engine_per_token_s": float(engine),
        "engine_per_admit_s": float(admit),
    }


def fit_noise(profile: Profile, rows: Rows) -> dict[str, float]:
    """The profile's "noise" section from traced steps (in trace order) priced by `profile`: prefill_sd, the
    standard deviation of log(measured / modelled) over steps with prefill; decode_sd, that of adjacent
    pure-decode steps' summed times, × √2 (the spread of one step whose pair has the pairs' spread)."""

    def log_ratio(picked: Rows) -> float | None:
        measured, modelled = sum(map(_own_seconds, picked)), sum(_modelled(profile, r) for r in picked)
        return float(np.log(measured / modelled)) if measured > 0 and modelled > 0 else None

    def decoding(r: dict[str, Any]) -> bool:
        return not r["prefill_tokens"] and bool(r["decode_seqs"])

    prefill = [x for r in rows if r["prefill_tokens"] and (x := log_ratio([r])) is not None]
    pairs, i = [], 0
    while i + 1 < len(rows):
        if decoding(rows[i]) and decoding(rows[i + 1]):
            if (x := log_ratio(rows[i : i + 2])) is not None:
                pairs.append(x)
            i += 2
        else:
            i += 1
    if len(prefill) < 2 or len(pairs) < 2:
        raise ValueError(f"noise: too few steps ({len(prefill)} with prefill, {len(pairs)} decode pairs)")
    return {"prefill_sd": float(np.std(prefill)), "decode_sd": float(np.std(pairs) * np.sqrt(2))}


def _modelled(profile: Profile, r: dict[str, Any]) -> float:
    """A traced step's seconds as `profile`'s step model prices it."""
    seconds = profile.decode(r["decode_seqs"], r["decode_context"])
    if r["prefill_tokens"]:
        p = profile.prefill
        graphed = r.get("graphed") and profile.graphed_step_s is not None
        fixed = profile.graphed_step_s if graphed else profile.prefill_step_s
        seconds += fixed + p.a * r["prefill_tokens"] + p.b * r["prefill_pairs"]
    return seconds + profile.events(r.get("admitted", 0), r.get("finished", 0))


def step_model_error(profile: Profile, rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """How `profile`'s step model prices recorded steps: {"decode": …, "prefill": …}, each the steps'
    count, their measured and modelled seconds, and the relative error (modelled / measured − 1). A step
    with prefill that the trace marks `graphed` costs the profile's graphed_step_s where it has one, any
    other step_s (traces from before the field say nothing: eager). Measured is each step's span less its
    host-tier calls, or the whole span where the profile's steps hold those calls."""

    kinds = {
        "decode": [r for r in rows if not r["prefill_tokens"] and r["decode_seqs"]],
        "prefill": [r for r in rows if r["prefill_tokens"]],
    }
    out: dict[str, dict[str, float]] = {}
    for kind, picked in kinds.items():
        measured = sum(_span_seconds(r) if profile.host_calls_in_steps else _own_seconds(r) for r in picked)
        model = sum(_modelled(profile, r) for r in picked)
        out[kind] = {
            "steps": len(picked),
            "measured_s": measured,
            "modelled_s": model,
            "error": model / measured - 1 if measured else 0.0,
        }
    return out
