"""What the engine benchmarks share: a greedy sampling preset, a CUDA timer, a wall-time wrapper for an
engine's methods, one engine step under the profiler, an LLM on the card with the benchmark defaults,
reproducible token-id prompts, and causal attention's FLOPs."""

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


def profiled_step(engine, path: Path) -> None:
    """One engine step under the torch profiler; its table of the top kernels (by CUDA time on a GPU) goes
    to `path`, after a line on the step's timeline: wall time, when the first kernel started, how long the
    kernels spanned and how much of that span the GPU was busy (the rest: waiting on the host)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof, record_function("engine_step"):
        engine.step()
        if cuda:
            torch.cuda.synchronize()
    key = "cuda_time_total" if cuda else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=70)
    path.write_text(step_timeline(prof.events()) + "\n" + table)


def step_timeline(events) -> str:
    """The step's timeline from profiler events (µs): the `engine_step` range and the device kernels."""
    step = next(e for e in events if e.name == "engine_step")
    start, end = step.time_range.start, step.time_range.end
    kernels = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA and e.name != "engine_step"  # not the range itself
    )
    if not kernels:
        return f"step wall {(end - start) / 1e3:.2f} ms; no device kernels"
    busy, reach = 0, kernels[0][0]
    for k_start, k_end in kernels:  # union of the kernels' intervals
        busy += max(0, k_end - max(k_start, reach))
        reach = max(reach, k_end)
    span = reach - kernels[0][0]
    return (
        f"step wall {(end - start) / 1e3:.2f} ms; first kernel at +{(kernels[0][0] - start) / 1e3:.2f} ms; "
        f"kernels span {span / 1e3:.2f} ms, GPU busy {busy / 1e3:.2f} ms ({busy / max(span, 1):.0%}); "
        f"after the last kernel {(end - reach) / 1e3:.2f} ms"
    )


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


_ACTIVE: set[str] = set()


def timed(obj, name: str, totals: dict[str, float], key: str) -> None:
    """Wrap obj.name so its wall time accumulates in totals[key] (a call inside another timed call under the
    same key, e.g. runner.run calling runner.launch, is not counted twice)."""
    fn = getattr(obj, name)
    active = _ACTIVE

    def wrapper(*args, **kwargs):
        if key in active:
            return fn(*args, **kwargs)
        active.add(key)
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            active.discard(key)
            totals[key] += time.perf_counter() - t

    setattr(obj, name, wrapper)


def attention_flops(q_lens: list[int], context_lens: list[int], heads: int, d: int, dv: int) -> float:
    """Causal attention FLOPs (QKᵀ and PV, 2 per multiply-add) over the visible pairs."""
    pairs = sum(ql * (c - ql) + ql * (ql + 1) / 2 for ql, c in zip(q_lens, context_lens, strict=True))
    return 2.0 * heads * pairs * (d + dv)
