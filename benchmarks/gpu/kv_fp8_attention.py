"""The Triton paged attention reading a bf16 KV cache against an fp8 one (--kv-cache-dtype fp8), at
Qwen3-Next's attention shapes (16 query heads over 2 KV heads, head dim 256, 16-token pages): decode at
batch 1 / 16 / 48 over 8k and 32k contexts, and a 2k-token chunk over a 30k prefix; median ms of
`triton.testing.do_bench`, the KV bytes each call reads, and the output's error against the bf16 cache
holding the same (dequantized) values.

    source benchmarks/gpu/device_env.sh && python benchmarks/gpu/kv_fp8_attention.py
"""

from __future__ import annotations

import torch
from ops_common import BF16, ms, paged_setup, record, rel

from flashstate.ops.attention.kv_cast import to_kv_cache
from flashstate.ops.attention.triton import paged_attention

HQ, HKV, D = 16, 2, 256
CASES = [
    ("decode", [1], [8192]),
    ("decode", [1] * 16, [8192] * 16),
    ("decode", [1] * 48, [8192] * 48),
    ("decode", [1], [32768]),
    ("decode", [1] * 16, [32768] * 16),
    ("decode", [1] * 48, [32768] * 48),
    ("chunk", [2048], [32768]),
]


def case(kind: str, q_lens: list[int], ctx: list[int]) -> None:
    q, kc, vc, cu, cl, bt = paged_setup(q_lens, ctx, HQ, HKV, D, D)
    k8, v8 = to_kv_cache(kc, torch.float8_e4m3fn), to_kv_cache(vc, torch.float8_e4m3fn)
    kb, vb = k8.to(BF16), v8.to(BF16)  # the fp8 values in a bf16 cache: the same inputs, twice the bytes
    del kc, vc

    def run(k, v):
        return paged_attention(q, k, v, cu_seqlens=cu, context_lens=cl, block_tables=bt, scale=D**-0.5)

    err = rel(run(k8, v8), run(kb, vb))
    t16, t8 = ms(lambda: run(kb, vb)), ms(lambda: run(k8, v8))
    kv16 = sum(ctx) * HKV * 2 * D * 2  # K and V bytes read from a bf16 cache
    record(
        "time", f"attention.{kind}.{len(q_lens)}x{ctx[0]}", bf16_ms=t16, fp8_ms=t8, speedup=t16 / t8,
        bf16_tb_per_s=kv16 / t16 / 1e9, fp8_tb_per_s=kv16 / 2 / t8 / 1e9, rel_err=err,
    )  # fmt: skip


if __name__ == "__main__":
    assert torch.cuda.is_available(), "needs a CUDA device"
    torch.manual_seed(0)
    for kind, q_lens, ctx in CASES:
        case(kind, q_lens, ctx)
        torch.cuda.empty_cache()
