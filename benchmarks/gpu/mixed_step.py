"""Engine step times under a serving load (issue 10's diagnosis): b sequences decoding at a long context,
alone (CUDA graphs) and with a prefill chunk in the same step (eager), for a few token budgets.

    PYTHONPATH=. python benchmarks/gpu/mixed_step.py [--preset qwen3-next-2b] [--batch 48]

Prints one table last and writes $OUT/mixed_step.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from engine_setup import make_llm, profiled_step, prompt  # noqa: E402

from flashstate import SamplingParams  # noqa: E402
from flashstate.models.presets import preset_dir  # noqa: E402


def timed_step(engine) -> tuple[float, int, int]:
    """(seconds, prefill tokens, decoding sequences) of one engine step."""
    seen: list[int] = []
    run = engine.runner.run

    def spy(batch):
        seen.extend(batch.num_tokens)
        return run(batch)

    engine.runner.run = spy
    sync()
    start = time.perf_counter()
    engine.step()
    sync()
    engine.runner.run = run
    return time.perf_counter() - start, sum(n for n in seen if n > 1), sum(n == 1 for n in seen)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_profile(engine, path: Path) -> None:
    """One engine step under cProfile: where the host's time goes (top functions by own time)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    sync()
    prof.enable()
    engine.step()
    sync()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
    path.write_text(text.getvalue())


def run(
    model_dir: Path,
    batch: int,
    context: int,
    budget: int,
    chunks: list[int],
    device: str,
    profile_dir: Path | None,
    graphs: bool = False,
) -> list[dict]:
    kw = {} if device == "cuda" else dict(device=device, dtype="float32", kv_cache_memory_bytes=1 << 30)
    llm = make_llm(
        model_dir, max_num_seqs=batch + 2, max_num_batched_tokens=budget, mixed_step_graphs=graphs, **kw
    )
    engine = llm.engine
    long = SamplingParams(max_tokens=4096, temperature=0, ignore_eos=True)
    shared = prompt(context, seed=1)
    llm.generate([shared], SamplingParams(max_tokens=1, temperature=0))  # cache the shared prefix
    for i in range(batch):
        engine.add_request(shared + prompt(8, seed=100 + i), long)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or (
        engine.scheduler.waiting
    ):
        engine.step()
    for _ in range(3):
        engine.step()
    rows = []
    for chunk in chunks:
        decode = [timed_step(engine)[0] for _ in range(10)]
        row = dict(budget=budget, chunk=chunk, batch=batch, context=context, decode_ms=1e3 * min(decode))
        for label, ids in (
            ("fresh", prompt(chunk, seed=7 + 100 * chunk)),
            ("over_prefix", shared + prompt(chunk, seed=8 + 100 * chunk)),
        ):
            engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0))
            steps = []
            while engine.scheduler.waiting or any(
                s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running
            ):
                steps.append(timed_step(engine))
            mixed = [s for s in steps if s[1] > 0]
            row[f"{label}_steps"] = [(round(1e3 * t, 2), p, d) for t, p, d in mixed]
            seconds = sum(t for t, _, _ in mixed)
            row[f"{label}_step_ms"] = 1e3 * seconds / max(len(mixed), 1)
            row[f"{label}_prefill_tok_s"] = sum(p for _, p, _ in mixed) / max(seconds, 1e-9)
        if profile_dir is not None:
            one = SamplingParams(max_tokens=1, temperature=0)
            engine.add_request(shared + prompt(chunk, seed=10 + 100 * chunk), one)
            profiled_step(engine, profile_dir / f"mixed_step_profile_{budget}_{chunk}.txt")
            engine.add_request(shared + prompt(chunk, seed=11 + 100 * chunk), one)
            host_profile(engine, profile_dir / f"mixed_step_host_{budget}_{chunk}.txt")
        rows.append(row)
    for row in rows:
        row["prefill_alone_ms"] = make_alone(llm, row["chunk"])
    for req in list(engine.requests):
        engine.abort(req)
    del llm
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def make_alone(llm, chunk: int) -> float:
    """The same chunk, fresh, with nothing else running (a second LLM would double the memory: reuse)."""
    engine = llm.engine
    for req in list(engine.requests):
        engine.abort(req)
    engine.add_request(prompt(chunk, seed=9), SamplingParams(max_tokens=1, temperature=0))
    seconds, _, _ = timed_step(engine)
    while engine.requests:
        engine.step()
    return 1e3 * seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="qwen3-next-2b")
    p.add_argument("--batch", type=int, default=48)
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--budgets", default="8192,32768")
    p.add_argument("--device", default="cuda")
    p.add_argument("--chunks", default="", help="prefill chunk sizes (default: each budget less the batch)")
    p.add_argument("--profile", action="store_true", help="profile one mixed step over the prefix")
    p.add_argument("--mixed-step-graphs", action="store_true", help="short chunks' steps as CUDA graphs")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("flashstate").setLevel(logging.INFO)  # the engine's set-up: graph capture times
    model_dir = preset_dir(args.preset)
    budgets = [int(b) for b in args.budgets.split(",")]
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    profile_dir = out if args.profile else None
    rows = []
    for b in budgets:
        chunks = [int(c) for c in args.chunks.split(",")] if args.chunks else [b - args.batch]
        graphs = args.mixed_step_graphs
        rows.extend(run(model_dir, args.batch, args.context, b, chunks, args.device, profile_dir, graphs))
        (out / "mixed_step.json").write_text(json.dumps(rows, indent=1))
    print("| budget | chunk | decode step | fresh chunk: steps (ms, prefill tokens, decodes) | prefill tok/s "
          "| over the prefix: ms per step, tok/s | chunk alone |")  # fmt: skip
    for r in rows:
        print(
            f"| {r['budget']} | {r['chunk']} | {r['decode_ms']:.1f} ms | {r['fresh_steps'][:3]} "
            f"| {r['fresh_prefill_tok_s']:.0f} "
            f"| {r['over_prefix_step_ms']:.1f}, {r['over_prefix_prefill_tok_s']:.0f} "
            f"| {r['prefill_alone_ms']:.1f} ms |"
        )


if __name__ == "__main__":
    main()
