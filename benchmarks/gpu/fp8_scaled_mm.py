"""cuBLAS block-FP8 GEMM through `torch.nn.functional.scaled_mm` (1×128 activation groups against 128×128
weight blocks, the published checkpoints' scaling) on the card, against our Triton block-FP8 GEMM and bf16
`F.linear`, at Qwen3-Next-80B's projection shapes (the shapes of fp8_gemm.py).

First it finds which scale layout and convention the installed torch accepts and computes correctly (the
activation scales outer-dim-major, the weight's K-blocks padded to a multiple of 4, scales as decode
multipliers or as their reciprocals), checking each against the dequantized fp32 product; then it times the
accepted one, activation quantization included, as CUDA-graph replays over REPLAYS weights (as fp8_gemm.py).
Prints one JSON line per case, then a table.

    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/fp8_scaled_mm.py
"""

# ruff: noqa: B023  (every lambda is timed at once, inside its loop iteration)
from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

from benchmarks.gpu.fp8_gemm import BF16_FLOPS, FP8_FLOPS, REPLAYS, SHAPES, graph_us
from flashstate.ops.fp8 import triton as fp8_triton
from flashstate.ops.fp8.block_quant import dequantize_block, quantize_block

TOKENS = (16, 48, 128, 256, 8192)


def weight_scale(scale_inv: torch.Tensor) -> torch.Tensor:
    """[N/128, K/128] → [L4, N/128] view, K-block-major, L4 = K/128 rounded up to 4 (cuBLAS's layout)."""
    pad = -scale_inv.shape[1] % 4
    return F.pad(scale_inv, (0, pad)).t() if pad else scale_inv.t()


def act_scale(s: torch.Tensor) -> torch.Tensor:
    """[M, K/128] row-major → the same values outer-dim-major (stride (1, M))."""
    return s.t().contiguous().t()


def cublas(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, reciprocal: bool) -> torch.Tensor:
    q, s = fp8_triton.quantize_activation(x)
    s = act_scale(s)
    if reciprocal:
        s, w_scale = 1 / s, 1 / w_scale
    return F.scaled_mm(q, w.t(), s, F.ScalingType.BlockWise1x128, w_scale, F.ScalingType.BlockWise128x128,
                       output_dtype=x.dtype)  # fmt: skip


def main() -> None:
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  cuda {torch.version.cuda}  "
          f"scaled_mm: {hasattr(F, 'scaled_mm')}", flush=True)  # fmt: skip
    rows, checks = [], []
    for name, (n, k) in SHAPES.items():
        dense = [torch.randn(n, k, device="cuda") / k**0.5 for _ in range(REPLAYS)]
        fp8 = [quantize_block(w) for w in dense]
        ws = [(w, s, weight_scale(s)) for w, s in fp8]
        bf16 = [w.bfloat16() for w in dense]
        del dense
        w_ref = dequantize_block(*fp8[0], torch.float32)
        for t in TOKENS:
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            q, s = fp8_triton.quantize_activation(x)
            ref = (q.float() * s.repeat_interleave(128, dim=1)[:, :k]) @ w_ref.t()
            errors = {}
            for reciprocal in (False, True):
                try:
                    got = cublas(x, ws[0][0], ws[0][2], reciprocal).float()
                    torch.cuda.synchronize()
                    errors[reciprocal] = ((got - ref).norm() / ref.norm()).item()
                except Exception as e:  # noqa: BLE001 (the probe reports what the installed torch refuses)
                    errors[reciprocal] = f"{type(e).__name__}: {str(e)[:160]}"
            check = dict(shape=name, T=t, rel_err_decode=errors[False], rel_err_reciprocal=errors[True])
            checks.append(check)
            print(json.dumps(check), flush=True)
            good = [r for r, e in errors.items() if isinstance(e, float) and e < 1e-2]
            if not good:
                continue
            reciprocal = good[0]
            flops = 2 * t * n * k
            us = graph_us(lambda w: cublas(x, w[0], w[2], reciprocal), ws)
            tri = graph_us(lambda w: fp8_triton.block_fp8_gemm(x, w[0], w[1]), ws)
            bf = graph_us(lambda w: F.linear(x, w), bf16)
            row = dict(shape=name, N=n, K=k, T=t, reciprocal=reciprocal, cublas_us=us, triton_us=tri,
                       bf16_us=bf, cublas_of_fp8_peak=flops / us * 1e6 / FP8_FLOPS,
                       triton_of_fp8_peak=flops / tri * 1e6 / FP8_FLOPS,
                       bf16_of_peak=flops / bf * 1e6 / BF16_FLOPS)  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        del fp8, ws, bf16
        torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "fp8_scaled_mm.json"), "w") as f:
            json.dump(dict(checks=checks, rows=rows), f, indent=1)
    print(f"\n{'shape':20} {'N':>6} {'K':>5} {'T':>5} {'cuBLAS µs':>9} {'Triton µs':>9} {'bf16 µs':>8} "
          f"{'cuBLAS %fp8':>11} {'Triton %fp8':>11}", file=sys.stdout)  # fmt: skip
    for r in rows:
        print(f"{r['shape']:20} {r['N']:6d} {r['K']:5d} {r['T']:5d} {r['cublas_us']:9.1f} "
              f"{r['triton_us']:9.1f} {r['bf16_us']:8.1f} {100 * r['cublas_of_fp8_peak']:10.1f}% "
              f"{100 * r['triton_of_fp8_peak']:10.1f}%")  # fmt: skip
    refused = [c for c in checks if not any(isinstance(e, float) and e < 1e-2 for e in list(c.values())[2:])]
    print(f"{len(checks) - len(refused)} of {len(checks)} cases computed correctly; refused or wrong: "
          + "; ".join(f"{c['shape']} T={c['T']}: {c['rel_err_decode']}" for c in refused[:6]))  # fmt: skip


if __name__ == "__main__":
    main()
