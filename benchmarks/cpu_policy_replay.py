"""Deterministic policy comparison on the CPU: coding agents replayed offline through the engine (no server,
no wall-clock effects: the cache's clock advances one tick per engine step and think times are counted
in steps), once per policy variant and seed, with a KV + state budget below the agents' working set.

    .venv/bin/python benchmarks/cpu_policy_replay.py --seeds 0 1 2 --cache-fraction 0.3 \
        --variants flashstate flashstate:lru vllm sglang none

A variant is `policy[:eviction][:noleaf]`. An agent: a system prefix shared by all agents, a first task,
then turns that re-send the previous prompt + reply + new tokens (tool output); now and then a sub-agent
forks from a prefix of the agent's context. The closed loop queues an agent's next turn `think` steps
after its reply.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass, field, replace

from flashstate import LLM, EngineConfig, SamplingParams
from flashstate.cache.cache_tensors import kv_bytes_per_block, state_bytes_per_slot


@dataclass(slots=True)
class Agent:
    turns: list[list[int]]  # new tokens of each turn
    think: list[int]  # steps before each turn is sent
    forks: dict[int, tuple[float, list[int]]]  # turn → (fraction of context kept, sub-agent task)
    context: list[int] = field(default_factory=list)
    turn: int = 0


def make_agents(n: int, turns: int, vocab: int, seed: int) -> list[Agent]:
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(256)]
    agents = []
    for _ in range(n):
        new = [system + [rng.randrange(vocab) for _ in range(rng.randint(200, 600))]]
        new += [[rng.randrange(vocab) for _ in range(rng.randint(20, 200))] for _ in range(turns - 1)]
        forks = {
            t: (rng.uniform(0.3, 0.9), [rng.randrange(vocab) for _ in range(rng.randint(30, 120))])
            for t in range(1, turns)
            if rng.random() < 0.2
        }
        agents.append(Agent(new, [rng.choice([0, 2, 5, 30]) for _ in range(turns)], forks))
    return agents


@dataclass(slots=True)
class Result:
    prompt: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return sum(self.cached) / max(sum(self.prompt), 1)

    @property
    def median_uncached(self) -> float:
        return statistics.median(p - c for p, c in zip(self.prompt, self.cached, strict=True))


def replay(llm: LLM, agents: list[Agent], max_tokens: int) -> Result:
    engine = llm.engine
    tick = [0]
    engine.cache._clock = lambda: float(tick[0])
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    result, owner, due = Result(), {}, {a: agents[a].think[0] for a in range(len(agents))}
    while due or engine.has_unfinished():
        for a in [a for a, at in due.items() if at <= tick[0]]:
            del due[a]
            agent = agents[a]
            owner[engine.add_request(agent.context + agent.turns[agent.turn], params)] = (a, False)
            if agent.turn in agent.forks and agent.context:
                keep, task = agent.forks[agent.turn]
                fork = agent.context[: int(len(agent.context) * keep)] + task
                owner[engine.add_request(fork, params)] = (a, True)
        for out in engine.step():
            if not out.finished:
                continue
            a, is_fork = owner.pop(out.request_id)
            result.prompt.append(len(out.prompt_token_ids))
            result.cached.append(out.num_cached_tokens)
            agent = agents[a]
            if not is_fork:
                agent.context = list(out.prompt_token_ids) + out.token_ids
                agent.turn += 1
                if agent.turn < len(agent.turns):
                    due[a] = tick[0] + agent.think[agent.turn]
        tick[0] += 1
    engine.check_integrity()
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=6)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--cache-fraction", type=float, default=0.3, help="budget / working set")
    p.add_argument(
        "--variants", nargs="+", default=["flashstate", "flashstate:lru", "vllm", "sglang", "none"]
    )
    a = p.parse_args()
    base = EngineConfig(block_size=16, max_num_seqs=8, prefix_cache_leaf_idle_seconds=40.0)
    probe = LLM.from_config(replace(base, enable_prefix_caching=False))
    spec, dtype = probe.engine.spec, probe.engine.dtype
    rows = []
    for variant in a.variants:
        policy, *opts = variant.split(":")
        per_seed = []
        for seed in a.seeds:
            agents = make_agents(a.agents, a.turns, spec.vocab_size, seed)
            tokens = sum(sum(len(t) + a.max_tokens for t in ag.turns) for ag in agents)
            working = tokens * kv_bytes_per_block(spec, 16, dtype) // 16 + a.agents * state_bytes_per_slot(
                spec, dtype
            )
            budget = int(working * a.cache_fraction) + base.max_num_seqs * state_bytes_per_slot(spec, dtype)
            config = replace(
                base,
                cache_policy=policy,
                kv_cache_memory_bytes=budget,
                seed=seed,
                prefix_cache_eviction="lru" if "lru" in opts else None,
                prefix_cache_leaf_last="noleaf" not in opts,
                prefill_cost_coefficients=(1e-5, 1e-9),
            )
            per_seed.append(replay(LLM.from_config(config), agents, a.max_tokens))
        hit = [r.hit_rate for r in per_seed]
        med = [r.median_uncached for r in per_seed]
        rows.append((variant, hit, med))
    print(
        f"{a.agents} agents × {a.turns} turns, budget = {a.cache_fraction} × working set, seeds {a.seeds}\n"
    )
    print("| variant | token hit rate (mean; per seed) | median uncached (mean; per seed) |\n|---|---|---|")
    for variant, hit, med in rows:
        print(
            f"| {variant} | {statistics.mean(hit):.1%} ({', '.join(f'{h:.1%}' for h in hit)}) | "
            f"{statistics.mean(med):.0f} ({', '.join(f'{m:.0f}' for m in med)}) |"
        )


if __name__ == "__main__":
    main()
