"""What the engine benchmarks on the GPU share: a greedy sampling preset, a CUDA timer, an LLM on the card
with the benchmark defaults, and reproducible token-id prompts."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from flashstate import LLM

GREEDY = dict(temperature=0, ignore_eos=True)


def cuda_time(fn, repeats: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def make_llm(model_dir: Path, **kw) -> LLM:
    args = dict(
        device="cuda",
        dtype="bfloat16",
        prefill_cost_coefficients=(1e-6, 1e-12),
        max_num_seqs=64,
        gpu_memory_utilization=0.85,
    )
    args.update(kw)
    return LLM(str(model_dir), **args)


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 2000, (n,), generator=g).tolist()
