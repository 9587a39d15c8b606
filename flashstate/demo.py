"""`flashstate demo`: concurrent coding agents replayed through the engine once per cache policy, side by
side, with a KV + state budget smaller than the agents' working set. No server, no downloads.

An agent: a system/tool prefix shared by every agent, a first task, then turns; each turn re-sends the
previous prompt + the model's reply + new tokens (tool output); now and then a sub-agent forks from a
prefix of the agent's context. Lanes run closed-loop: an agent's next turn is queued as soon as its
previous reply finished.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field, replace

from flashstate.config import EngineConfig
from flashstate.engine.cache_tensors import kv_bytes_per_block, state_bytes_per_slot
from flashstate.llm import LLM
from flashstate.sampling_params import SamplingParams


@dataclass(slots=True)
class Agent:
    turns: list[list[int]]  # new tokens of each turn
    forks: dict[int, tuple[float, list[int]]]  # turn → (fraction of context kept, sub-agent task)
    context: list[int] = field(default_factory=list)
    turn: int = 0


def make_agents(num_agents: int, num_turns: int, vocab: int, seed: int) -> list[Agent]:
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(256)]
    agents = []
    for _ in range(num_agents):
        turns = [system + [rng.randrange(vocab) for _ in range(rng.randint(100, 400))]]
        turns += [[rng.randrange(vocab) for _ in range(rng.randint(20, 200))] for _ in range(num_turns - 1)]
        forks = {
            t: (rng.uniform(0.3, 0.9), [rng.randrange(vocab) for _ in range(rng.randint(30, 120))])
            for t in range(1, num_turns)
            if rng.random() < 0.25
        }
        agents.append(Agent(turns, forks))
    return agents


@dataclass(slots=True)
class PolicyResult:
    policy: str
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    output_tokens: int = 0
    wall: float = 0.0

    @property
    def hit_rate(self) -> float:
        return sum(self.cached_tokens) / max(sum(self.prompt_tokens), 1)

    @property
    def median_uncached(self) -> float:
        return statistics.median(p - c for p, c in zip(self.prompt_tokens, self.cached_tokens, strict=True))

    def ttft(self, q: float) -> float:
        xs = sorted(self.ttfts)
        return xs[min(int(q * len(xs)), len(xs) - 1)]


def replay(llm: LLM, agents: list[Agent], max_tokens: int) -> PolicyResult:
    """Closed-loop lanes: every agent's next turn (and its forks) is queued as its reply arrives."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    result = PolicyResult(engine.config.cache_policy if engine.config.prefix_caching else "none")
    owner: dict[str, tuple[int, bool]] = {}  # request → (agent, is fork)

    def submit(a: int) -> None:
        agent = agents[a]
        prompt = agent.context + agent.turns[agent.turn]
        owner[engine.add_request(prompt, params)] = (a, False)
        if agent.turn in agent.forks and agent.context:
            keep, task = agent.forks[agent.turn]
            owner[engine.add_request(agent.context[: int(len(agent.context) * keep)] + task, params)] = (
                a,
                True,
            )

    start = time.perf_counter()
    for a in range(len(agents)):
        submit(a)
    while engine.has_unfinished():
        for out in engine.step():
            if not out.finished:
                continue
            a, fork = owner.pop(out.request_id)
            result.prompt_tokens.append(len(out.prompt_token_ids))
            result.cached_tokens.append(out.num_cached_tokens)
            result.ttfts.append(out.stats.ttft or 0.0)
            result.output_tokens += len(out.token_ids)
            if fork:
                continue
            agent = agents[a]
            agent.context = list(out.prompt_token_ids) + out.token_ids
            agent.turn += 1
            if agent.turn < len(agent.turns):
                submit(a)
    result.wall = time.perf_counter() - start
    engine.check_integrity()
    return result


def working_set_bytes(llm: LLM, agents: list[Agent], max_tokens: int) -> int:
    """KV of every agent's final context plus one state each."""
    spec, dtype, bs = llm.engine.spec, llm.engine.dtype, llm.engine.config.block_size
    tokens = sum(sum(len(t) + max_tokens for t in a.turns) for a in agents)
    return -(-tokens // bs) * kv_bytes_per_block(spec, bs, dtype) + len(agents) * state_bytes_per_slot(
        spec, dtype
    )


def run_demo(
    config: EngineConfig,
    policies: tuple[str, ...] = ("flashstate", "vllm", "sglang", "none"),
    num_agents: int = 6,
    num_turns: int = 5,
    max_tokens: int = 16,
    cache_fraction: float = 0.5,
) -> list[PolicyResult]:
    """Replay the same agents under each policy. Unless `config` sets kv_cache_memory_bytes, the budget is
    `cache_fraction` of the agents' working set plus every running request's working state."""
    probe = LLM.from_config(replace(config, enable_prefix_caching=False))
    spec, dtype = probe.engine.spec, probe.engine.dtype
    agents = make_agents(num_agents, num_turns, spec.vocab_size, config.seed)
    budget = config.kv_cache_memory_bytes or (
        int(working_set_bytes(probe, agents, max_tokens) * cache_fraction)
        + config.max_num_seqs * state_bytes_per_slot(spec, dtype)
    )
    del probe
    results = []
    for policy in policies:
        llm = LLM.from_config(replace(config, cache_policy=policy, kv_cache_memory_bytes=budget))
        results.append(
            replay(llm, make_agents(num_agents, num_turns, spec.vocab_size, config.seed), max_tokens)
        )
    return results


def format_table(results: list[PolicyResult]) -> str:
    rows = [
        "| policy | requests | token hit rate | median uncached tokens "
        "| TTFT p50 (s) | TTFT p90 (s) | wall (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.policy} | {len(r.prompt_tokens)} | {r.hit_rate:.1%} | {r.median_uncached:.0f} | "
            f"{r.ttft(0.5):.3f} | {r.ttft(0.9):.3f} | {r.wall:.1f} |"
        )
    return "\n".join(rows)
