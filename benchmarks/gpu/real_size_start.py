"""Real-size presets on one GPU with `--load-format dummy`: the engine's start-up (weights made on the
device, calibration skipped with fixed coefficients, warm-up, CUDA graphs) timed from the constructor's
call to its return — what a server does before /health answers — then one 1,024-token prompt and 64
greedy tokens. Prints whether decode graphs were captured (MoE models capture through ops/moe) and the
decode step time.

    source benchmarks/gpu/device_env.sh
    python benchmarks/gpu/real_size_start.py qwen3.6-35b-a3b nemotron-3-nano-30b-a3b
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())

from flashstate import LLM, SamplingParams  # noqa: E402

CUDA = torch.cuda.is_available()


def one(preset: str, max_model_len: int) -> dict:
    if CUDA:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    llm = LLM(
        preset,
        load_format="dummy",
        max_model_len=max_model_len,
        max_num_seqs=48,
        prefill_cost_coefficients=(1e-5, 1e-10),
    )
    if CUDA:
        torch.cuda.synchronize()
    start_s = time.perf_counter() - t0
    runner = llm.engine.runner
    graphs = getattr(runner, "graphs", None)
    prompt = [(7 * i) % 1000 + 10 for i in range(1024)]
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))[0]
    s = out.stats
    decode_ms = 1e3 * (s.finished_time - s.first_token_time) / max(len(out.token_ids) - 1, 1)
    row = {
        "preset": preset,
        "start_s": round(start_s, 1),
        "decode_graphs": None if graphs is None else list(graphs.sizes),
        "ttft_s": round(s.ttft, 3),
        "decode_ms_b1": round(decode_ms, 2),
        "gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if CUDA else None,
    }
    del llm, runner, graphs
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("presets", nargs="+")
    p.add_argument("--max-model-len", type=int, default=32768)
    args = p.parse_args()
    rows = []
    for preset in args.presets:
        try:
            rows.append(one(preset, args.max_model_len))
        except Exception as e:  # noqa: BLE001 — report and go on to the next preset
            rows.append({"preset": preset, "error": f"{type(e).__name__}: {e}"[:300]})
        print(json.dumps(rows[-1]), flush=True)
    print("\npreset | start s | decode graphs | TTFT 1k s | decode ms (b=1) | peak GiB")
    for r in rows:
        if "error" in r:
            print(f"{r['preset']} | error: {r['error']}")
            continue
        graphs = "yes" if r["decode_graphs"] else "no (eager)"
        cells = (r["preset"], r["start_s"], graphs, r["ttft_s"], r["decode_ms_b1"], r["gpu_mem_gib"])
        print(" | ".join(str(c) for c in cells))


if __name__ == "__main__":
    main()
