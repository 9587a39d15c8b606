"""The fused MoE layer (ops/moe) on the card against a grouped-GEMM roofline.

Shapes: Qwen3-Next-80B-A3B (hidden 2048, 512 experts, top-10, expert width 512, shared expert 512) and a
Qwen3.6-35B-A3B-like one (hidden 2048, 256 experts, top-8, width 512, shared expert 512), bf16 random
weights, T = 1, 16, 48 (decode) and 8192 (prefill). Each figure is the median of CUDA-graph replays of
R layer calls on R different inputs (different experts each, so the L2 does not hold them), per call.

Roofline: decode, the bytes of the touched experts' weights (+ shared expert and router) / 4.8 TB/s;
prefill, the FLOPs (routed + shared + router) / 787 TFLOP/s. `loop` is the replaced per-expert Python
loop (eager: it waits on the device). Prints one line per case, then a table.

    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/moe_kernel.py
"""

# ruff: noqa: B023  (every lambda is timed at once, inside its loop iteration)
from __future__ import annotations

import json
import os
import sys

import torch
from triton.testing import do_bench

from flashstate.models.qwen3_next import Qwen3NextSparseMoeBlock
from flashstate.ops.moe import moe_experts, naive, softmax_topk
from flashstate.ops.moe import triton as moe_triton
from flashstate.spec.model_spec import MoeSpec

BANDWIDTH, BF16_FLOPS = 4.8e12, 787e12
REPLAYS = 8
SHAPES = {
    "qwen3-next-80b": dict(hidden=2048, experts=512, top_k=10, inter=512, shared=512),
    "qwen3.6-35b": dict(hidden=2048, experts=256, top_k=8, inter=512, shared=512),
}


def build(s: dict) -> Qwen3NextSparseMoeBlock:
    spec = MoeSpec(
        s["experts"], s["top_k"], s["inter"], s["shared"], 1, True, "silu", shared_expert_gate=True
    )
    with torch.device("meta"):
        block = Qwen3NextSparseMoeBlock(s["hidden"], spec)
    block = block.to_empty(device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02)
    return block


def graph_ms(fn, inputs: list[torch.Tensor]) -> float:
    """Median ms of one call, from replays of a graph that calls fn on each of the inputs."""
    with torch.no_grad():
        for x in inputs[:2]:
            fn(x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for x in inputs:
                fn(x)
    return do_bench(graph.replay, warmup=25, rep=200, return_mode="median") / len(inputs)


def roofline_us(block, s: dict, inputs: list[torch.Tensor]) -> tuple[float, float]:
    """(bytes roofline, FLOP roofline) in µs for one call, averaged over the inputs."""
    h, i, k, e = s["hidden"], s["inter"], s["top_k"], s["experts"]
    expert_bytes, dense_bytes = 3 * h * i * 2, (3 * h * s["shared"] + e * h + h) * 2
    touched = []
    with torch.no_grad():
        for x in inputs:
            _, ids = softmax_topk(block.gate(x), k, True)
            touched.append(ids.unique().numel())
    t = inputs[0].shape[0]
    flops = 2 * t * (k * 3 * h * i + 3 * h * s["shared"] + e * h)
    mean_bytes = sum(touched) / len(touched) * expert_bytes + dense_bytes
    return mean_bytes / BANDWIDTH * 1e6, flops / BF16_FLOPS * 1e6


SWEEP = {  # (up tiles, down tiles) tried beside the chosen ones: the heuristic's neighbours
    16: [((16, 64, 128, 4, 4), (16, 64, 128, 4, 4)), ((16, 32, 256, 4, 3), (16, 64, 256, 4, 3))],
    8192: [((64, 128, 64, 4, 4), (64, 128, 64, 4, 4)), ((128, 128, 64, 8, 3), (128, 128, 64, 8, 3)),
           ((64, 64, 64, 4, 4), (64, 128, 64, 4, 3)), ((128, 64, 64, 8, 3), (128, 128, 64, 8, 3)),
           ((64, 64, 64, 4, 3), (64, 64, 64, 4, 4))],
}  # fmt: skip


def sweep(block, s: dict) -> None:
    routed = block.routed_experts()
    for t, configs in SWEEP.items():
        x = torch.randn(t, s["hidden"], device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            w, ids = softmax_topk(block.gate(x), s["top_k"], True)
        w = w.bfloat16()
        for up, down in configs:
            up_t, down_t = moe_triton.Tiles(*up), moe_triton.Tiles(*down)
            us = do_bench(lambda: moe_triton.moe_experts(x, w, ids, routed, up_t, down_t), rep=100,
                          return_mode="median") * 1e3  # fmt: skip
            print(json.dumps(dict(sweep=t, up=up, down=down, experts_eager_us=us)), flush=True)


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for name, s in SHAPES.items():
        block = build(s)
        for t in (1, 16, 48, 8192):
            inputs = [
                torch.randn(t, s["hidden"], device="cuda", dtype=torch.bfloat16) for _ in range(REPLAYS)
            ]
            bytes_us, flops_us = roofline_us(block, s, inputs)
            layer = graph_ms(block, inputs) * 1e3
            routed = block.routed_experts()
            with torch.no_grad():
                w, ids = softmax_topk(block.gate(inputs[0]), s["top_k"], True)
                w = w.bfloat16()
                routes = {x.data_ptr(): softmax_topk(block.gate(x), s["top_k"], True) for x in inputs}
            kernels = graph_ms(lambda x: moe_experts(x, *routes[x.data_ptr()], routed), inputs) * 1e3
            bm = moe_triton.choose_tiles(
                t * s["top_k"], s["experts"], s["inter"], s["hidden"], torch.bfloat16
            ).block_m
            aligned = (
                graph_ms(lambda x: moe_triton.align(routes[x.data_ptr()][1], s["experts"], bm), inputs) * 1e3
            )
            loop = None
            if t in (1, 8192):
                with torch.no_grad():
                    loop = do_bench(lambda: naive.moe_experts(inputs[0], w, ids, routed), warmup=5, rep=50,
                                    return_mode="median") * 1e3  # fmt: skip
            roof = bytes_us if t <= 48 else flops_us
            tiles = moe_triton.choose_tiles(
                t * s["top_k"], s["experts"], s["inter"], s["hidden"], torch.bfloat16
            )
            row = dict(shape=name, T=t, layer_us=layer, experts_us=kernels, align_us=aligned, loop_us=loop,
                       roofline_us=roof, bound="bytes" if t <= 48 else "flops", of_roofline=roof / layer,
                       bytes_roof_us=bytes_us, flops_roof_us=flops_us, up_tiles=tiles._asdict())  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        if name == "qwen3-next-80b":
            sweep(block, s)
        del block
        torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "moe_kernel.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}  torch {torch.__version__}", file=sys.stdout)
    print(f"{'shape':16} {'T':>5} {'layer µs':>9} {'experts':>8} {'align':>6} {'roof µs':>8} {'bound':>5} "
          f"{'%roof':>6} {'loop µs':>8}")  # fmt: skip
    for r in rows:
        loop = f"{r['loop_us']:8.0f}" if r["loop_us"] is not None else f"{'':8}"
        print(f"{r['shape']:16} {r['T']:5d} {r['layer_us']:9.1f} {r['experts_us']:8.1f} {r['align_us']:6.1f} "
              f"{r['roofline_us']:8.1f} {r['bound']:>5} "
              f"{100 * r['of_roofline']:5.0f}% {loop}")  # fmt: skip


if __name__ == "__main__":
    main()
