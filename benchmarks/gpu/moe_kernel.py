"""The fused MoE layer (ops/moe) on the card against a grouped-GEMM roofline.

Shapes: Qwen3-Next-80B-A3B (hidden 2048, 512 experts, top-10, expert width 512, shared expert 512) and a
Qwen3.6-35B-A3B-like one (hidden 2048, 256 experts, top-8, width 512, shared expert 512), bf16 random
weights, T = 1, 16, 48 (decode) and 8192 (prefill). Each figure is the median of CUDA-graph replays of
R layer calls on R different inputs (different experts each, so the L2 does not hold them), per call.

Roofline: decode, the bytes of the touched experts' weights (+ shared expert and router) / 4.8 TB/s;
prefill, the FLOPs (routed + shared + router) / 787 TFLOP/s. `loop` is the replaced per-expert Python
loop (eager: it waits on the device). The routed experts alone are also timed with block-FP8 stacks
(ops/moe/triton_fp8.py: w8a16 at decode, w8a8 at prefill) against their own roofline: the touched experts'
bytes (fp8: half of bf16's) / 4.8 TB/s at decode, the routed FLOPs / 787 (bf16) or 1,574 (fp8) TFLOP/s at
prefill; the other FP8 mode is timed beside. Prints one line per case, then a table.

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
from flashstate.ops.fp8.block_quant import quantize_block
from flashstate.ops.moe import Experts, moe_experts, naive, softmax_topk, triton_fp8
from flashstate.ops.moe import triton as moe_triton
from flashstate.spec.model_spec import MoeSpec

BANDWIDTH, BF16_FLOPS, FP8_FLOPS = 4.8e12, 787e12, 1574e12
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


def fp8_experts(routed: Experts) -> Experts:
    """The routed stacks block-quantized (128×128 scales), as an FP8 checkpoint would load them."""
    (w_in, s_in), (w_out, s_out) = quantize_block(routed.w_in), quantize_block(routed.w_out)
    return Experts(w_in, w_out, routed.act, routed.gated, w_in_scale=s_in, w_out_scale=s_out)


def experts_roofline_us(s: dict, t: int, touched: float, bytes_per_weight: int, flops_peak: float) -> float:
    """The routed experts alone: touched experts' weight bytes / bandwidth at decode, FLOPs / peak beyond."""
    h, i, k = s["hidden"], s["inter"], s["top_k"]
    if t <= 48:
        return touched * 3 * h * i * bytes_per_weight / BANDWIDTH * 1e6
    return 2 * t * k * 3 * h * i / flops_peak * 1e6


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
    s["touched"] = sum(touched) / len(touched)  # read by experts_roofline_us
    return mean_bytes / BANDWIDTH * 1e6, flops / BF16_FLOPS * 1e6


SWEEP = {  # (up tiles, down tiles) tried beside the chosen ones: the heuristic's neighbours
    16: [((16, 64, 128, 4, 4), (16, 64, 128, 4, 4)), ((16, 32, 256, 4, 3), (16, 64, 256, 4, 3))],
    8192: [((64, 128, 64, 4, 4), (64, 128, 64, 4, 4)), ((128, 128, 64, 8, 3), (128, 128, 64, 8, 3)),
           ((64, 64, 64, 4, 4), (64, 128, 64, 4, 3)), ((128, 64, 64, 8, 3), (128, 128, 64, 8, 3)),
           ((64, 64, 64, 4, 3), (64, 64, 64, 4, 4))],
}  # fmt: skip
FP8_SWEEP = {  # (up tiles, down tiles, w8a8) for the FP8 stacks; block_k is the 128 of the scales
    16: [((16, 32, 128, 4, 4), (16, 32, 128, 4, 4), False), ((16, 64, 128, 4, 4), (16, 64, 128, 4, 4), False),
         ((16, 128, 128, 4, 3), (16, 128, 128, 4, 3), True)],
    8192: [((64, 128, 128, 4, 4), (64, 128, 128, 4, 4), True),
           ((128, 128, 128, 8, 3), (128, 128, 128, 8, 3), True),
           ((64, 64, 128, 4, 3), (64, 128, 128, 4, 3), True),
           ((64, 128, 128, 4, 3), (64, 128, 128, 4, 3), False)],
}  # fmt: skip


def sweep(block, s: dict) -> None:
    routed = block.routed_experts()
    quantized = fp8_experts(routed)
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
        for up, down, a_fp8 in FP8_SWEEP.get(t, []):
            up_t, down_t = moe_triton.Tiles(*up), moe_triton.Tiles(*down)
            us = do_bench(lambda: triton_fp8.moe_experts(x, w, ids, quantized, up_t, down_t, a_fp8), rep=100,
                          return_mode="median") * 1e3  # fmt: skip
            print(json.dumps(dict(sweep=t, fp8=True, a_fp8=a_fp8, up=up, down=down, experts_eager_us=us)),
                  flush=True)  # fmt: skip


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
            quantized = fp8_experts(routed)
            kernels_fp8 = graph_ms(lambda x: moe_experts(x, *routes[x.data_ptr()], quantized), inputs) * 1e3
            fp8_mode = triton_fp8.uses_fp8_dots(t * s["top_k"], s["experts"])
            other = not fp8_mode
            other_fp8 = graph_ms(
                lambda x: triton_fp8.moe_experts(x, *routes[x.data_ptr()], quantized, a_fp8=other), inputs
            ) * 1e3  # fmt: skip
            roof_bf16 = experts_roofline_us(s, t, s["touched"], 2, BF16_FLOPS)
            roof_fp8 = experts_roofline_us(s, t, s["touched"], 1, FP8_FLOPS)
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
                       bytes_roof_us=bytes_us, flops_roof_us=flops_us, up_tiles=tiles._asdict(),
                       experts_roof_us=roof_bf16, experts_of_roof=roof_bf16 / kernels,
                       fp8_experts_us=kernels_fp8, fp8_mode="w8a8" if fp8_mode else "w8a16",
                       fp8_other_mode_us=other_fp8, fp8_experts_roof_us=roof_fp8,
                       fp8_experts_of_roof=roof_fp8 / kernels_fp8)  # fmt: skip
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
          f"{'%roof':>6} {'loop µs':>8} {'ex%roof':>7} {'fp8 µs':>7} {'mode':>5} {'other':>6} "
          f"{'fp8%roof':>8}")  # fmt: skip
    for r in rows:
        loop = f"{r['loop_us']:8.0f}" if r["loop_us"] is not None else f"{'':8}"
        print(f"{r['shape']:16} {r['T']:5d} {r['layer_us']:9.1f} {r['experts_us']:8.1f} {r['align_us']:6.1f} "
              f"{r['roofline_us']:8.1f} {r['bound']:>5} "
              f"{100 * r['of_roofline']:5.0f}% {loop} {100 * r['experts_of_roof']:6.0f}% "
              f"{r['fp8_experts_us']:7.1f} {r['fp8_mode']:>5} {r['fp8_other_mode_us']:6.1f} "
              f"{100 * r['fp8_experts_of_roof']:7.0f}%")  # fmt: skip


if __name__ == "__main__":
    main()
