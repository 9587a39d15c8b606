"""How much of a measured run's figure is which sessions happened to run: a bootstrap over its agents. A
run's window holds a few hundred requests from a few dozen agents, and a tail figure (TTFT p90) lands where
few of them set it, often on the cliff between mostly cached turns and cold ones; drawing the run's
top-level sessions again with replacement (each with all its turns and sub-agents, since one agent's turns
share its cache and its queue) and reading the window's summary (metrics.summarize) over each draw gives the
spread of that figure over runs like this one. It is a lower bound on the run-to-run spread: the draws keep
each request's measured times, so the machine's noise and the requests' effect on one another stay as
measured.

    bands = session_bands(result, {"TTFT p90": lambda s: s["ttft_s"]["p90"]})   # {"TTFT p90": (lo, hi)}
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from flashstate.bench.metrics import RequestRecord, SessionRecord, agent_of, summarize


def session_draws(result: dict[str, Any], draws: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """The window's summary of `draws` runs made of the recorded run's agents drawn with replacement (as many
    as it had), each with its requests and session records; the window and GPU count are the result's own."""
    start, end = result["timeline"]["window"]
    gpus = result["replay"].get("num_gpus", 1)
    requests: dict[str, list[RequestRecord]] = defaultdict(list)
    sessions: dict[str, list[SessionRecord]] = defaultdict(list)
    for d in result["requests"]:
        requests[agent_of(d["session"])].append(RequestRecord(**d))
    for d in result["sessions"]:
        sessions[agent_of(d["session"])].append(SessionRecord(**d))
    agents = sorted(requests)
    if not agents:
        return []
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        picked = [agents[i] for i in rng.integers(0, len(agents), len(agents))]
        reqs = [r for a in picked for r in requests[a]]
        sess = [s for a in picked for s in sessions[a]]
        out.append(summarize(reqs, sess, start, end, gpus))
    return out


def session_bands(
    result: dict[str, Any],
    metrics: dict[str, Callable[[dict[str, Any]], float | None]],
    draws: int = 1000,
    seed: int = 0,
    coverage: float = 0.9,
) -> dict[str, tuple[float, float] | None]:
    """Each metric's central `coverage` interval over session_draws (5th to 95th percentile by default);
    None where no draw has a value."""
    summaries = session_draws(result, draws, seed)
    tail = (1 - coverage) / 2 * 100
    out: dict[str, tuple[float, float] | None] = {}
    for name, pick in metrics.items():
        values = [v for s in summaries if (v := pick(s)) is not None]
        if values:
            lo, hi = np.percentile(values, [tail, 100 - tail])
            out[name] = (float(lo), float(hi))
        else:
            out[name] = None
    return out
