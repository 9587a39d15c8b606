"""Host tier on the CPU: the cpu_policy_replay agents (offline, deterministic: one clock tick per engine
step) with a GPU-side cache budget well below their working set, with the host tier off and on (a host
capacity above the working set). Reports the token hit rate, the share of prompt tokens restored from the
host tier, and the cut in uncached (prefilled) tokens.

    PYTHONPATH=. .venv/bin/python benchmarks/cpu_host_tier.py --seeds 0 1 2 --cache-fraction 0.25 \\
        --backends off memory mooncake

Write-backs are flushed after every engine step so that the run is deterministic (in serving they overlap
the next steps); `mooncake` starts its own mooncake_master on loopback.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_policy_replay import make_agents, replay  # noqa: E402

from flashstate import LLM, EngineConfig  # noqa: E402
from flashstate.cache.cache_tensors import kv_bytes_per_block, state_bytes_per_slot  # noqa: E402


def run(config: EngineConfig, agents, max_tokens: int) -> dict:
    llm = LLM.from_config(config)
    engine, host = llm.engine, llm.engine.host
    if host is not None:
        step = engine.step

        def step_and_flush():
            out = step()
            host.flush()
            return out

        engine.step = step_and_flush
    result = replay(llm, agents, max_tokens)
    prompt = sum(result.prompt)
    row = {
        "hit_rate": result.hit_rate,
        "uncached": prompt - sum(result.cached),
        "median_uncached": result.median_uncached,
        "requests": len(result.prompt),
        "host_tokens": host.stats.restored_tokens / prompt if host else 0.0,
        "host_shared_tokens": host.stats.shared_tokens if host else 0,  # of those, KV found on the GPU
        "host_restores": host.stats.restores if host else 0,
        "host_evictions": host.stats.evictions if host else 0,
    }
    engine.close()
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=6)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--cache-fraction", type=float, default=0.25, help="GPU-side budget / working set")
    p.add_argument("--host-fraction", type=float, default=2.0, help="host tier capacity / working set")
    p.add_argument("--backends", nargs="+", default=["off", "memory"], choices=["off", "memory", "mooncake"])
    a = p.parse_args()
    base = EngineConfig(
        block_size=16,
        max_num_seqs=8,
        prefix_cache_leaf_idle_seconds=40.0,
        prefill_cost_coefficients=(1e-5, 1e-9),
    )
    probe = LLM.from_config(replace(base, enable_prefix_caching=False))
    spec, dtype = probe.engine.spec, probe.engine.dtype
    master = None
    if "mooncake" in a.backends:
        from flashstate.cache.host.mooncake import start_master

        master = start_master()
    rows = {b: [] for b in a.backends}
    try:
        for seed in a.seeds:
            agents0 = make_agents(a.agents, a.turns, spec.vocab_size, seed)
            tokens = sum(sum(len(t) + a.max_tokens for t in ag.turns) for ag in agents0)
            slot = state_bytes_per_slot(spec, dtype)
            working = tokens * kv_bytes_per_block(spec, 16, dtype) // 16 + a.agents * slot
            budget = int(working * a.cache_fraction) + base.max_num_seqs * slot
            for backend in a.backends:
                config = replace(base, kv_cache_memory_bytes=budget, seed=seed)
                if backend != "off":
                    config = replace(
                        config,
                        host_cache=backend,
                        host_cache_bytes=max(int(working * a.host_fraction), 16 << 20),
                        mooncake_master=master.address if backend == "mooncake" else None,
                    )
                agents = make_agents(a.agents, a.turns, spec.vocab_size, seed)
                rows[backend].append(run(config, agents, a.max_tokens))
                print(f"seed {seed} {backend}: {rows[backend][-1]}", flush=True)
    finally:
        if master is not None:
            master.stop()
    print(
        f"{a.agents} agents × {a.turns} turns, GPU-side budget = {a.cache_fraction} × working set, "
        f"host tier = {a.host_fraction} × working set, seeds {a.seeds}\n"
    )
    off = rows.get("off")
    print(
        "| host tier | token hit rate | from host tier | uncached tokens | vs off | median uncached |"
        " host restores |\n|---|---|---|---|---|---|---|"
    )
    for backend, rs in rows.items():
        cut = (
            f"{1 - sum(r['uncached'] for r in rs) / sum(r['uncached'] for r in off):.0%} fewer"
            if off and backend != "off"
            else "—"
        )
        print(
            f"| {backend} | {statistics.mean(r['hit_rate'] for r in rs):.1%} "
            f"| {statistics.mean(r['host_tokens'] for r in rs):.1%} "
            f"| {sum(r['uncached'] for r in rs)} | {cut} "
            f"| {statistics.mean(r['median_uncached'] for r in rs):.0f} "
            f"| {sum(r['host_restores'] for r in rs)} |"
        )


if __name__ == "__main__":
    main()
