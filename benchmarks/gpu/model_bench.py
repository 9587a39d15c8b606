"""The engine on the H200 with a ~2B benchmark preset: correctness first, then prefill, decode, in-chunk
export and checkpoint copy timings against the card's measured ceilings (issue 7).

    PYTHONPATH=. python benchmarks/gpu/model_bench.py [--preset qwen3-next-2b] [--no-async-scheduling]

Writes $OUT/model_bench_<preset>[_<parts run>].json and prints one table last. Every timing goes through
the engine's own objects (paged KV pool, state pool, ModelRunner, CUDA graphs), not bare kernels.

Switch for A/B runs (environment): FLASHSTATE_SDPA_GQA=0 repeats the K/V heads before SDPA (the path
before issue 7's fusions) instead of passing grouped heads (`enable_gqa`, taken only when torch picks the
same fused backend for them); the JSON's "sdpa_gqa" records what was decided per shape.

Definitions:
  prefill FLOPs   2 · (non-embedding linear weights) · T  +  per attention layer 2 · H · (Dqk + Dv) · T²/2
                  (causal), the lm head for the last token only; recurrent-mixer FLOPs are not counted
  decode floor    (every weight once + each sequence's states read and written + its KV read) divided
                  by the measured device copy rate (read + write bytes per second)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from engine_setup import GREEDY, cuda_time, make_llm, profiled_step, prompt, timed  # noqa: E402
from exactness import check_greedy_paths, check_oracle  # noqa: E402
from smoke import ceilings  # noqa: E402

from flashstate import LLM, SamplingParams  # noqa: E402
from flashstate.cache.cache_tensors import kv_bytes_per_block, state_bytes_per_slot  # noqa: E402
from flashstate.layers.metadata import ForwardMetadata  # noqa: E402
from flashstate.models.presets import preset_dir  # noqa: E402

PARTS = ("oracle", "paths", "prefill", "export", "decode")


def out_dir() -> Path:
    return Path(os.environ.get("OUT", "."))


def linear_weights(model: torch.nn.Module) -> int:
    """Weights of every nn.Linear except the lm head."""
    return sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name != "lm_head"
    )


def prefill_flops(llm: LLM, tokens: int) -> float:
    engine = llm.engine
    spec, a = engine.spec, engine.spec.attention
    flops = 2.0 * linear_weights(engine.model) * tokens + 2.0 * spec.hidden_size * spec.vocab_size
    if a is not None:
        per_layer = 2.0 * a.num_heads * (a.head_dim + a.v_head_dim) * tokens * tokens / 2
        flops += per_layer * len(spec.attention_layer_ids)
    return flops


def profile_step(llm: LLM, ids: list[int], params: SamplingParams) -> None:
    """Where one prefill step's GPU time goes: $OUT/profile_prefill_<n>.txt, the top kernels."""
    llm.engine.add_request(ids, params)
    profiled_step(llm.engine, out_dir() / f"profile_prefill_{len(ids)}.txt")
    while llm.engine.has_unfinished():
        llm.engine.step()


def bench_prefill(
    model_dir: Path, lengths: list[int], ceiling: float, out: dict, profile_at: int = 32768
) -> None:
    rows = []
    for n in lengths:
        llm = make_llm(
            model_dir,
            enable_prefix_caching=False,
            max_num_batched_tokens=n,
            max_model_len=n + 16,
            max_num_seqs=4,
            kv_cache_memory_bytes=16 << 30,
        )
        params = SamplingParams(max_tokens=1, **GREEDY)
        llm.generate([prompt(min(n, 2048), 9)], params)
        seconds = []
        for rep in range(2):
            ids = prompt(n, 10 + rep)
            llm.engine.add_request(ids, params)
            torch.cuda.synchronize()
            start = time.perf_counter()
            llm.engine.step()
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
            while llm.engine.has_unfinished():
                llm.engine.step()
        s = min(seconds)
        flops = prefill_flops(llm, n)
        if n == profile_at:
            profile_step(llm, prompt(n, 20), params)
        rows.append(
            {
                "tokens": n,
                "seconds": s,
                "tokens_per_s": n / s,
                "tflops": flops / s / 1e12,
                "fraction_of_matmul": flops / s / 1e12 / ceiling,
            }
        )
        del llm
        torch.cuda.empty_cache()
    out["prefill"] = rows
    from flashstate.ops.attention import sdpa

    out["sdpa_gqa"] = {str(key): grouped for key, grouped in sdpa._GQA_CHOICE.items()}


def bench_export(model_dir: Path, n: int, out: dict) -> None:
    """One n-token prefill forward with 0 vs 4 exported states (model forward only, same batch)."""
    llm = make_llm(
        model_dir,
        enable_prefix_caching=False,
        max_num_batched_tokens=n,
        max_model_len=n + 16,
        max_num_seqs=8,
        kv_cache_memory_bytes=16 << 30,
    )
    engine = llm.engine
    bs = engine.config.block_size
    table = list(range(-(-n // bs)))
    ids = torch.tensor(prompt(n, 11), device="cuda")
    slots = engine.cache.state_pool

    def meta(exports):
        return ForwardMetadata.build([n], [n], [table], bs, [0], [False], exports, device="cuda")

    free = [slots.allocate() for _ in range(5)]
    plain = meta([])
    exp = meta([(0, p, s) for p, s in zip((1000, 7777, n // 2 + 13, n - 5), free[1:], strict=True)])
    with torch.inference_mode():
        t0 = cuda_time(lambda: engine.model(ids, plain), 5)
        t1 = cuda_time(lambda: engine.model(ids, exp), 5)
        copy = cuda_time(lambda: engine.runner.caches.copy_slot(free[1], free[2]), 20)
    slot_bytes = state_bytes_per_slot(engine.spec, engine.dtype)
    out["export"] = {
        "tokens": n,
        "exports": 4,
        "forward_s": t0,
        "forward_with_exports_s": t1,
        "overhead": t1 / t0 - 1,
        "checkpoint_bytes": slot_bytes,
        "checkpoint_copy_s": copy,
        "checkpoint_copy_gb_per_s": 2 * slot_bytes / copy / 1e9,
    }
    del llm
    torch.cuda.empty_cache()


def read_weight_bytes(model: torch.nn.Module, batch: int) -> int:
    """The weight bytes one decode step reads: every parameter once, except an untied embedding table, of
    which it reads one row per sequence (a tied one is read in full by the logits)."""
    tied = model.spec.tie_word_embeddings
    total = 0
    for module in model.modules():
        for p in module.parameters(recurse=False):
            rows = batch if isinstance(module, torch.nn.Embedding) and not tied else p.shape[0]
            total += min(rows, p.shape[0]) * p[0].numel() * p.element_size()
    return total


def profile_replay(graph: torch.cuda.CUDAGraph, path: Path, replays: int = 5) -> float:
    """The kernels of a decode graph's replay (CUPTI traces the nodes of a graph): their table, by CUDA
    time, goes to `path`; returns the kernels per replay."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sum(e.device_type == DeviceType.CUDA for e in prof.events()) / replays
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=60, max_name_column_width=70)
    path.write_text(f"{kernels:.0f} kernels per replay ({replays} replays profiled)\n{table}")
    return kernels


def bench_decode(
    model_dir: Path,
    batches: list[int],
    context: int,
    copy_rate: float,
    out: dict,
    async_scheduling: bool = True,
) -> None:
    """`b` sequences decoding at `context` tokens: they share one 32k-token cached prefix (a prefix hit each,
    so building the batch costs one prefill), then each decodes; every step goes through engine.step().
    The step is split into: scheduling, the runner (its graph/eager forward, then sampling, whose result
    read waits for the GPU; with async scheduling also the launch of the next step), and postprocessing
    (stop checks on token ids, outputs; detokenisation happens when an output's text is read); the graph
    replay alone is timed with CUDA events afterwards, on the batch's own inputs."""
    rows = []
    for eager in (False, True):
        llm = make_llm(
            model_dir,
            max_num_batched_tokens=8192,
            max_model_len=context + 512,
            max_num_seqs=max(batches),
            enforce_eager=eager,
            kv_cache_memory_bytes=16 << 30,  # the batch shares one 32k prefix; pools are over-provisioned 2x
            async_scheduling=async_scheduling,
        )
        engine = llm.engine
        totals: dict[str, float] = defaultdict(float)
        timed(engine.scheduler, "schedule", totals, "schedule")
        # A pipelined decode step (async scheduling) goes through launch / launch_ahead / collect, not run.
        for name in ("run", "launch", "launch_ahead", "collect"):
            timed(engine.runner, name, totals, "runner")
        timed(engine.runner.sampler, "forward", totals, "sampler")
        timed(engine, "_postprocess", totals, "postprocess")
        base = prompt(context - 1, 12)
        llm.generate([base], SamplingParams(max_tokens=1, **GREEDY))
        graphs = engine.runner.graphs
        for b in batches:
            steps = 64
            for i in range(b):
                engine.add_request(base + [i], SamplingParams(max_tokens=steps + 8, **GREEDY))
            while (
                any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running)
                or engine.scheduler.waiting
            ):
                engine.step()
            for _ in range(4):  # warm-up: the first eager decode steps compile their kernels' variants
                engine.step()
            torch.cuda.synchronize()
            totals.clear()
            start = time.perf_counter()
            for _ in range(steps):
                engine.step()
            torch.cuda.synchronize()
            step = (time.perf_counter() - start) / steps
            parts = {k: v / steps for k, v in totals.items()}
            replay_s = None
            if graphs is not None:  # the static buffers hold this batch's last decode step
                replay = graphs._graphs[next(s for s in graphs.sizes if s >= b)]
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                ev[0].record()
                for _ in range(10):
                    replay.replay()
                ev[1].record()
                torch.cuda.synchronize()
                replay_s = ev[0].elapsed_time(ev[1]) / 10 / 1e3
                kernels = profile_replay(replay, out_dir() / f"profile_decode_b{b}.txt")
            for seq in list(engine.scheduler.running):  # the replays above advanced their states: drop them
                engine.abort(seq.request_id)
            spec = engine.spec
            weights = read_weight_bytes(engine.model, b)
            kv = kv_bytes_per_block(spec, 1, engine.dtype) * (context + 40) * b
            states = 2 * state_bytes_per_slot(spec, engine.dtype) * b
            floor = (weights + kv + states) / copy_rate  # copy_rate: bytes moved (read + written) per second
            row = {
                "batch": b,
                "context": context,
                "cuda_graphs": not eager,
                "async_scheduling": async_scheduling,
                "step_s": step,
                "floor_s": floor,
                "step_over_floor": step / floor,
                "parts_s": parts,
            }
            if replay_s is not None:
                row["graph_replay_s"] = replay_s
                row["replay_over_floor"] = replay_s / floor
                row["host_overhead"] = 1 - replay_s / step
                row["kernels_per_replay"] = kernels
            rows.append(row)
        del llm
        torch.cuda.empty_cache()
    out["decode"] = rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="qwen3-next-2b")
    p.add_argument("--prefill", default="8192,32768,131072")
    p.add_argument("--decode-batches", default="1,16,64")
    p.add_argument("--decode-context", type=int, default=32768)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--skip", default="", help="comma list of: oracle,paths,prefill,export,decode")
    a = p.parse_args()
    skip = set(a.skip.split(","))
    out: dict = {"preset": a.preset, "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    out.update(ceilings())
    start = time.perf_counter()
    model_dir = preset_dir(a.preset)
    out["materialize_s"] = time.perf_counter() - start
    ran = [name for name in PARTS if name not in skip]
    tag = "" if len(ran) == len(PARTS) else "_" + "-".join(ran)  # a partial run does not overwrite another
    path = out_dir() / f"model_bench_{a.preset}{tag}.json"
    steps = [
        ("oracle", lambda: check_oracle(model_dir, out)),
        ("paths", lambda: check_greedy_paths(model_dir, out)),
        (
            "prefill",
            lambda: bench_prefill(
                model_dir, [int(x) for x in a.prefill.split(",")], out["bf16_matmul_tflops"], out
            ),
        ),
        ("export", lambda: bench_export(model_dir, 32768, out)),
        (
            "decode",
            lambda: bench_decode(
                model_dir,
                [int(x) for x in a.decode_batches.split(",")],
                a.decode_context,
                out["copy_gb_per_s"] * 1e9,
                out,
                a.async_scheduling,
            ),
        ),
    ]
    for name, fn in steps:
        if name in skip:
            continue
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:  # one failing part must not hide the others' numbers
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"
            out[f"{name}_traceback"] = traceback.format_exc()
        out[f"{name}_wall_s"] = time.perf_counter() - t
        torch.cuda.empty_cache()
        path.write_text(json.dumps(out, indent=1))  # after each part: a command cut short keeps the others
        print(f"{name}: {out[f'{name}_wall_s']:.0f} s", out.get(name, out.get(f"{name}_error")), flush=True)
    print(json.dumps(out, indent=1))
    print(
        f"\nceilings: bf16 matmul {out['bf16_matmul_tflops']:.0f} TFLOP/s, "
        f"copy {out['copy_gb_per_s']:.0f} GB/s"
    )
    for r in out.get("prefill", []):
        print(
            f"prefill {r['tokens']:>7}: {r['tokens_per_s']:>9.0f} tok/s  {r['tflops']:6.1f} TFLOP/s  "
            f"{r['fraction_of_matmul']:.1%} of matmul"
        )
    for r in out.get("decode", []):
        extra = ""
        if "host_overhead" in r:
            extra = (
                f"  replay {r['graph_replay_s'] * 1e3:.2f} ms (×{r['replay_over_floor']:.2f})"
                f" host {r['host_overhead']:.1%} kernels {r['kernels_per_replay']:.0f}"
            )
        extra += "  " + " ".join(f"{k} {v * 1e3:.2f}" for k, v in r["parts_s"].items())
        print(
            f"decode b={r['batch']:>3} graphs={r['cuda_graphs']!s:5} async={r['async_scheduling']!s:5}: "
            f"{r['step_s'] * 1e3:7.2f} ms/step  "
            f"floor {r['floor_s'] * 1e3:6.2f} ms  ×{r['step_over_floor']:.2f}{extra}"
        )
    if "export" in out:
        e = out["export"]
        print(
            f"export: +{e['overhead']:.2%} for 4 states in {e['tokens']} tokens; checkpoint copy "
            f"{e['checkpoint_copy_s'] * 1e6:.0f} µs ({e['checkpoint_copy_gb_per_s']:.0f} GB/s)"
        )
    if "oracle" in out:
        print("oracle", {x: y for x, y in out["oracle"].items() if "tokens" not in x})
    for label, r in out.get("greedy_paths", {}).items():
        print("greedy paths", label, r)
    for k, v in out.items():
        if k.endswith("_error"):
            print("ERROR", k, v, out[k.replace("_error", "_traceback")].splitlines()[-4:])


if __name__ == "__main__":
    main()
