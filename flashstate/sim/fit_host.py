"""The host tier's call costs (a profile's "host" section) measured from runs' server metrics.

A server with a host tier counts the engine thread's seconds inside each of the tier's calls
(`host_cache_engine_seconds_total{call=...}`); a bench result keeps the counters' change over the run
(`server_metrics.delta`). Summed over the runs that restored from a tier, the per-unit costs the simulator
charges (sim/host.py):

    restore_s_per_token = (start_restore + load) / restored tokens   (an inline restore: read, check, copy)
    load_s_per_token    = load / restored tokens                     (the copy into the blocks alone)
    write_back_s        = write_back / states written
    lookup_s_per_token  = lookup / (2 · prompt tokens sent)          (a request is looked up twice, on
                                                                      joining the queue and at admission,
                                                                      as the simulator charges it)

A run whose restores were read ahead while queued paid part of their read off the engine thread, so its
`start_restore` is not a whole restore's: such runs are refused. read_ahead_s_per_token is not measured here
(it is a fetch thread's time, not the engine thread's).
"""

from __future__ import annotations

from typing import Any

from flashstate.bench.metrics import server_sum

SECONDS = "flashstate:host_cache_engine_seconds_total"
CALLS = ("lookup", "start_restore", "load", "write_back")


def _counter(delta: dict[str, float], name: str, label: str = "") -> float:
    """A counter's change over the run, 0 where the server never counted it."""
    return server_sum(delta, name, label) or 0.0


def fit_host_calls(results: list[dict[str, Any]]) -> tuple[dict[str, float], str] | None:
    """Call costs from the bench `results` that restored from a host tier, and what they were measured on;
    None when none did. Raises ValueError for a run whose restores were read ahead."""
    total = dict.fromkeys(CALLS, 0.0)
    restored = states = prompt = 0.0
    runs = 0
    for result in results:
        delta = (result.get("server_metrics") or {}).get("delta") or {}
        tokens = _counter(delta, "flashstate:host_cache_restored_tokens_total")
        if tokens <= 0:
            continue
        if _counter(delta, "flashstate:host_cache_prefetches_total") > 0:
            raise ValueError(
                f"host call costs: run {result.get('label')!r} read restores ahead while queued (its "
                "start_restore is not a whole restore's); fit them on runs without read-aheads"
            )
        for call in CALLS:
            total[call] += _counter(delta, SECONDS, f'call="{call}"')
        restored += tokens
        states += _counter(delta, "flashstate:host_cache_states_written_total")
        prompt += result["summary"]["run_prompt_tokens"]
        runs += 1
    if not runs:
        return None
    restore = total["start_restore"] + total["load"]
    costs = {
        "lookup_s_per_token": total["lookup"] / (2 * prompt),
        "restore_s_per_token": restore / restored,
        "load_s_per_token": total["load"] / restored,
    }
    if states:
        costs["write_back_s"] = total["write_back"] / states
    said = (
        f"host-tier call costs from the engine thread's seconds by call ({SECONDS.split(':')[1]}) of {runs} "
        f"run{'s' if runs > 1 else ''}: start_restore + load {restore:.2f} s over {restored:,.0f} restored "
        f"tokens, load {total['load']:.2f} s, write-backs {total['write_back']:.2f} s over {states:,.0f} "
        f"states, lookups {total['lookup']:.2f} s over two lookups of each of {prompt:,.0f} prompt tokens"
    )
    return costs, said
