"""Prefill and decode throughput of the engine on the embedded default (tiny) model, CPU.

    .venv/bin/python benchmarks/cpu_throughput.py [--model DIR] [--threads N]

Prefill: one request of N prompt tokens, max_tokens=1 (time to first token). Decode: B concurrent
requests after their prefill, tokens per second over the decode steps only.
"""

from __future__ import annotations

import argparse
import time

import torch

from flashstate import LLM, SamplingParams


def prefill_rate(llm: LLM, n: int, repeats: int = 3) -> float:
    best = float("inf")
    for r in range(repeats):
        prompt = [(7 * i + r) % 2000 for i in range(n)]
        start = time.perf_counter()
        llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        best = min(best, time.perf_counter() - start)
    return n / best


def decode_rate(llm: LLM, batch: int, steps: int = 64) -> float:
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    for b in range(batch):
        engine.add_request([(b * 31 + i) % 2000 for i in range(64)], params)
    while any(s.is_prefilling for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    tokens, start = 0, time.perf_counter()
    while engine.has_unfinished():
        tokens += sum(len(o.delta_token_ids) for o in engine.step())
    return tokens / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM(args.model, enable_prefix_caching=False, max_num_batched_tokens=2048, max_num_seqs=64)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| phase | shape | tokens/s |\n|---|---|---|")
    for n in (512, 2048, 8192):
        print(f"| prefill | 1 × {n} tokens | {prefill_rate(llm, n):,.0f} |")
    for b in (1, 8, 32):
        print(f"| decode | batch {b} | {decode_rate(llm, b):,.0f} |")


if __name__ == "__main__":
    main()
