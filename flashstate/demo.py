"""`flashstate demo`: a few coding agents, each re-sending a growing context turn after turn, through the
engine on the embedded default model. Prints what the engine did."""

from __future__ import annotations

import random
import statistics
import time

from flashstate.llm import LLM
from flashstate.sampling_params import SamplingParams


def agent_turns(num_agents: int, num_turns: int, vocab: int, seed: int) -> list[list[list[int]]]:
    """Per agent, the new tokens of each turn: a shared system prefix, then tool output of varying size."""
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(192)]
    return [
        [
            system + [rng.randrange(vocab) for _ in range(rng.randint(60, 240))]
            if t == 0
            else [rng.randrange(vocab) for _ in range(rng.randint(20, 160))]
            for t in range(num_turns)
        ]
        for _ in range(num_agents)
    ]


def run_demo(llm: LLM, num_agents: int = 4, num_turns: int = 4, max_tokens: int = 24, seed: int = 0) -> dict:
    vocab = llm.engine.spec.vocab_size
    turns = agent_turns(num_agents, num_turns, vocab, seed)
    contexts: list[list[int]] = [[] for _ in range(num_agents)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    prompt_tokens = cached = output_tokens = 0
    ttfts: list[float] = []
    start = time.perf_counter()
    for t in range(num_turns):
        prompts = [ctx + turns[a][t] for a, ctx in enumerate(contexts)]
        outs = llm.generate(prompts, params)
        for a, out in enumerate(outs):
            contexts[a] = prompts[a] + out.token_ids
            prompt_tokens += len(out.prompt_token_ids)
            cached += out.num_cached_tokens
            output_tokens += len(out.token_ids)
            ttfts.append(out.stats.ttft or 0.0)
        print(f"turn {t + 1}/{num_turns}: contexts {[len(c) for c in contexts]} tokens")
    wall = time.perf_counter() - start
    report = {
        "requests": num_agents * num_turns,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "token_hit_rate": cached / max(prompt_tokens, 1),
        "output_tokens": output_tokens,
        "ttft_p50_s": statistics.median(ttfts),
        "wall_s": wall,
        "tokens_per_s": (prompt_tokens + output_tokens) / wall,
    }
    return report
