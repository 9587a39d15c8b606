"""The dense block-FP8 GEMM (ops/fp8/triton.py) on the card, against bf16 torch.matmul, at Qwen3-Next-80B's
projection shapes (hidden 2048): decode T = 1, 16, 48 and prefill T = 8192.

Each figure is the median of CUDA-graph replays of R calls over R different weights (R·bytes > L2, so
each call reads its weight from HBM), per call. Prints one JSON line per case, then a table:
    TFLOP/s and its fraction of the FP8 peak (1,574 TFLOP/s; bf16: 787), and, at decode, bytes/s (weight
    + scales + activations in and out) as a fraction of 4.8 TB/s.
`mode` is the path fp8_linear takes (w8a16 up to 64 rows, w8a8 beyond); decode rows also time the other
mode, and a sweep times neighbouring tiles so the shape heuristic can be checked.

    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/fp8_gemm.py
"""

# ruff: noqa: B023  (every lambda is timed at once, inside its loop iteration)
from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from flashstate.ops.fp8 import triton as fp8_triton
from flashstate.ops.fp8.block_quant import quantize_block

BANDWIDTH, BF16_FLOPS, FP8_FLOPS = 4.8e12, 787e12, 1574e12
REPLAYS = 8
SHAPES = {  # projection → (N, K) of Qwen3-Next-80B-A3B
    "attn.qkv(+gate)": (9216, 2048),
    "attn.o_proj": (2048, 4096),
    "linear.in_proj_qkvz": (12288, 2048),
    "linear.out_proj": (2048, 4096),
    "shared.gate_up": (1024, 2048),
    "shared.down": (2048, 512),
}
TOKENS = (1, 16, 48, 8192)
SWEEP = {  # T → tiles tried beside the chosen ones (block_m, block_n, warps, stages) and the mode
    1: [((16, 16, 4, 4), False), ((16, 32, 4, 4), False), ((16, 64, 4, 4), False), ((16, 128, 4, 3), False),
        ((16, 64, 4, 4), True)],
    8192: [((64, 128, 4, 3), True), ((64, 128, 4, 4), True), ((128, 128, 8, 3), True),
           ((128, 128, 8, 4), True), ((128, 256, 8, 3), True), ((128, 64, 4, 4), True)],
}  # fmt: skip


def graph_us(fn, args: list) -> float:
    """Median µs of one call, from replays of a graph that calls fn on each of args."""
    for a in args[:2]:
        fn(a)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for a in args:
            fn(a)
    return do_bench(graph.replay, warmup=25, rep=200, return_mode="median") / len(args) * 1e3


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        dense = [torch.randn(n, k, device="cuda") / k**0.5 for _ in range(REPLAYS)]
        fp8 = [quantize_block(w) for w in dense]
        bf16 = [w.bfloat16() for w in dense]
        del dense
        for t in TOKENS:
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            flops = 2 * t * n * k
            moved = n * k + 4 * fp8[0][1].numel() + 2 * t * (k + n)  # fp8 weight, scales, x in, y out
            auto = t > fp8_triton.W8A16_MAX_ROWS
            us = graph_us(lambda w: fp8_triton.block_fp8_gemm(x, *w), fp8)
            other = None
            if t <= 48:
                other = graph_us(lambda w: fp8_triton.block_fp8_gemm(x, *w, a_fp8=not auto), fp8)
            ref = graph_us(lambda w: F.linear(x, w), bf16)
            row = dict(shape=name, N=n, K=k, T=t, mode="w8a8" if auto else "w8a16", fp8_us=us,
                       other_mode_us=other, bf16_us=ref, fp8_tflops=flops / us * 1e-6,
                       of_fp8_peak=flops / us * 1e6 / FP8_FLOPS, bf16_of_peak=flops / ref * 1e6 / BF16_FLOPS,
                       bytes_per_s=moved / us * 1e6, of_bandwidth=moved / us * 1e6 / BANDWIDTH,
                       bf16_of_bandwidth=(2 * n * k + 2 * t * (k + n)) / ref * 1e6 / BANDWIDTH,
                       tiles=fp8_triton.choose_tiles(t, n, auto)._asdict())  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
            for tiles, a_fp8 in SWEEP.get(t, []) if name in ("attn.o_proj", "linear.in_proj_qkvz") else []:
                pick = fp8_triton.Tiles(*tiles)
                swept = graph_us(lambda w: fp8_triton.block_fp8_gemm(x, *w, a_fp8=a_fp8, tiles=pick), fp8)
                print(json.dumps(dict(sweep=name, T=t, tiles=tiles, a_fp8=a_fp8, us=swept,
                                      tflops=flops / swept * 1e-6)), flush=True)  # fmt: skip
        del fp8, bf16
        torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "fp8_gemm.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}  torch {torch.__version__}", file=sys.stdout)
    print(f"{'shape':20} {'N':>6} {'K':>5} {'T':>5} {'mode':>6} {'fp8 µs':>8} {'other':>7} {'bf16 µs':>8} "
          f"{'TFLOP/s':>8} {'%fp8pk':>6} {'%bf16pk':>7} {'TB/s':>5} {'%BW':>4} {'bf16%BW':>7}")  # fmt: skip
    for r in rows:
        other = f"{r['other_mode_us']:7.1f}" if r["other_mode_us"] is not None else f"{'':7}"
        print(f"{r['shape']:20} {r['N']:6d} {r['K']:5d} {r['T']:5d} {r['mode']:>6} {r['fp8_us']:8.1f} "
              f"{other} {r['bf16_us']:8.1f} {r['fp8_tflops']:8.1f} {100 * r['of_fp8_peak']:5.1f}% "
              f"{100 * r['bf16_of_peak']:6.1f}% {r['bytes_per_s'] / 1e12:5.2f} "
              f"{100 * r['of_bandwidth']:3.0f}% {100 * r['bf16_of_bandwidth']:6.0f}%")  # fmt: skip


if __name__ == "__main__":
    main()
