"""GPU ops against their CPU oracles, then op-level timings on the card. One call, one table.

    PYTHONPATH=. python benchmarks/gpu/ops_check.py        # on the device machine; writes $OUT/ops_check.json
    PYTHONPATH=. python benchmarks/gpu/ops_check.py --steps time_recurrent   # one part only
    PYTHONPATH=. python benchmarks/gpu/ops_check.py --sweep                  # also try attention tilings

Correctness: every GPU backend (FLA gated delta rule / KDA / SSD, Triton conv, Triton paged attention)
runs a small varlen batch (fresh and pooled initial states, GQA, exports inside chunks, decode) in bf16,
and the naive op runs the same bf16 inputs on the CPU in fp32; ‖gpu − ref‖ / ‖ref‖ per output.
Timing: `triton.testing.do_bench` medians at 32k-token prefill and 32k-context decode shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from ops_common import BF16, DEV, paged_setup, record, rel, rows  # noqa: E402
from ops_timing import time_attention, time_conv, time_recurrent  # noqa: E402

from flashstate.ops import attention, gated_delta_rule, kda, short_conv, ssd  # noqa: E402
from flashstate.ops.attention import naive as attn_naive  # noqa: E402
from flashstate.ops.gated_delta_rule import naive as gdn_naive  # noqa: E402
from flashstate.ops.kda import naive as kda_naive  # noqa: E402
from flashstate.ops.short_conv import naive as conv_naive  # noqa: E402
from flashstate.ops.ssd import naive as ssd_naive  # noqa: E402


def varlen(lengths: list[int], slots: list[int], fresh: list[bool], exports: list[int]):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return cu, torch.tensor(slots), torch.tensor([not f for f in fresh]), torch.tensor(exports)


def run_both(op_gpu, op_cpu, inputs: list[torch.Tensor], pool: torch.Tensor, meta, kwargs) -> dict:
    cu, idx, has, exp = meta
    pool_gpu, pool_cpu = pool.to(DEV), pool.clone()
    out_g, ex_g = op_gpu(
        *[x.to(DEV) for x in inputs],
        state_pool=pool_gpu,
        state_indices=idx.to(DEV),
        has_initial_state=has.to(DEV),
        cu_seqlens=cu.to(DEV),
        export_token_ids=exp.to(DEV),
        **kwargs,
    )
    out_c, ex_c = op_cpu(
        *inputs,
        state_pool=pool_cpu,
        state_indices=idx,
        has_initial_state=has,
        cu_seqlens=cu,
        export_token_ids=exp,
        **kwargs,
    )
    return {"out": rel(out_g, out_c), "pool": rel(pool_gpu, pool_cpu), "export": rel(ex_g, ex_c)}


def check_recurrent() -> None:
    torch.manual_seed(0)
    lengths, slots, fresh = [300, 1, 77, 130], [5, 2, 0, 7], [False, True, False, True]
    exports = [0, 63, 64, 200, 299, 300, 301, 340, 377, 500]  # chunk edges, mid-chunk, 1-token span
    meta = varlen(lengths, slots, fresh, exports)
    t = sum(lengths)
    dec = varlen([1] * 5, [5, 2, 0, 7, 3], [False, True, False, False, True], [1, 3])

    def gdn_inputs(t, hk=2, hv=4, d=64):
        return [
            torch.randn(1, t, hk, d).to(BF16),
            torch.randn(1, t, hk, d).to(BF16),
            torch.randn(1, t, hv, d).to(BF16),
            F.logsigmoid(torch.randn(1, t, hv)) * 0.5,
            torch.rand(1, t, hv).to(BF16),
        ]

    pool = torch.randn(8, 4, 64, 64) * 0.1
    for name, gpu, cpu in [
        ("chunk", gated_delta_rule.chunk_gated_delta_rule, gdn_naive.chunk_gated_delta_rule),
        (
            "fused_recurrent",
            gated_delta_rule.fused_recurrent_gated_delta_rule,
            gdn_naive.fused_recurrent_gated_delta_rule,
        ),
    ]:
        for label, m, n in [("prefill", meta, t), ("decode", dec, 5)]:
            record(
                "check",
                f"gdn.{name}.{label}",
                **run_both(gpu, cpu, gdn_inputs(n), pool, m, {"use_qk_l2norm_in_kernel": True}),
            )

    def kda_inputs(t, h=4, d=64):
        return [
            torch.randn(1, t, h, d).to(BF16),
            torch.randn(1, t, h, d).to(BF16),
            torch.randn(1, t, h, d).to(BF16),
            F.logsigmoid(torch.randn(1, t, h, d)) * 0.5,
            torch.rand(1, t, h).to(BF16),
        ]

    for name, gpu, cpu in [
        ("chunk", kda.chunk_kda, kda_naive.chunk_kda),
        ("fused_recurrent", kda.fused_recurrent_kda, kda_naive.fused_recurrent_kda),
    ]:
        for label, m, n in [("prefill", meta, t), ("decode", dec, 5)]:
            record(
                "check",
                f"kda.{name}.{label}",
                **run_both(gpu, cpu, kda_inputs(n), pool, m, {"use_qk_l2norm_in_kernel": True}),
            )

    def ssd_inputs(t, h=8, p=32, g=2, n=64):
        return [
            torch.randn(1, t, h, p).to(BF16),
            torch.randn(1, t, h).to(BF16) - 1.0,
            -torch.rand(h) * 4,
            torch.randn(1, t, g, n).to(BF16),
            torch.randn(1, t, g, n).to(BF16),
            torch.randn(h),
        ]

    ssd_pool = torch.randn(8, 8, 32, 64) * 0.1
    kw = {"dt_bias": torch.randn(8) * 0.1, "dt_limit": (0.0, 4.0)}
    for name, gpu, cpu in [
        ("chunk", ssd.chunk_ssd, ssd_naive.chunk_ssd),
        ("fused_recurrent", ssd.fused_recurrent_ssd, ssd_naive.fused_recurrent_ssd),
    ]:
        for label, m, n in [("prefill", meta, t), ("decode", dec, 5)]:
            k = dict(kw, dt_bias=kw["dt_bias"].to(DEV))
            cu, idx, has, exp = m
            inputs = ssd_inputs(n)
            pg, pc = ssd_pool.to(DEV), ssd_pool.clone()
            yg, eg = gpu(
                *[x.to(DEV) for x in inputs],
                **k,
                state_pool=pg,
                state_indices=idx.to(DEV),
                has_initial_state=has.to(DEV),
                cu_seqlens=cu.to(DEV),
                export_token_ids=exp.to(DEV),
            )
            yc, ec = cpu(
                *inputs,
                **kw,
                state_pool=pc,
                state_indices=idx,
                has_initial_state=has,
                cu_seqlens=cu,
                export_token_ids=exp,
            )
            record("check", f"ssd.{name}.{label}", out=rel(yg, yc), pool=rel(pg, pc), export=rel(eg, ec))

    for label, m, n in [("prefill", meta, t), ("decode", dec, 5)]:
        cu, idx, has, exp = m
        x, w, b = torch.randn(n, 96).to(BF16), torch.randn(96, 4), torch.randn(96)
        pool_c = torch.randn(8, 96, 3)
        pg, pc = pool_c.to(DEV), pool_c.clone()
        yg, eg = short_conv.causal_conv1d(
            x.to(DEV),
            w.to(DEV),
            b.to(DEV),
            conv_state_pool=pg,
            state_indices=idx.to(DEV),
            has_initial_state=has.to(DEV),
            cu_seqlens=cu.to(DEV),
            export_token_ids=exp.to(DEV),
        )
        yc, ec = conv_naive.causal_conv1d(
            x.float(),
            w,
            b,
            conv_state_pool=pc,
            state_indices=idx,
            has_initial_state=has,
            cu_seqlens=cu,
            export_token_ids=exp,
        )
        record("check", f"short_conv.{label}", out=rel(yg, yc), pool=rel(pg, pc), export=rel(eg, ec))


def check_attention() -> None:
    torch.manual_seed(1)
    cases = {
        "prefill_gqa": ([100, 1, 37, 260], [100, 50, 300, 900], 8, 2, 128, 128),
        "decode_gqa": ([1, 1, 1], [1, 700, 3000], 8, 2, 128, 128),
        "prefill_mla": ([70, 5], [70, 400], 4, 4, 192, 128),
        "decode_mla": ([1, 1], [33, 2000], 4, 4, 192, 128),
    }
    for name, (ql, ctx, hq, hkv, d, dv) in cases.items():
        q, kc, vc, cu, cl, bt = paged_setup(ql, ctx, hq, hkv, d, dv)
        out = attention.paged_attention(
            q, kc, vc, cu_seqlens=cu, context_lens=cl, block_tables=bt, scale=d**-0.5
        )
        ref = attn_naive.paged_attention(
            q.cpu().float(),
            kc.cpu().float(),
            vc.cpu().float(),
            cu_seqlens=cu.cpu(),
            context_lens=cl.cpu(),
            block_tables=bt.cpu(),
            scale=d**-0.5,
        )
        record("check", f"attention.{name}", out=rel(out, ref))
    k = torch.randn(20, 2, 128, device=DEV, dtype=BF16)
    kc, vc = (
        torch.zeros(4, 16, 2, 128, device=DEV, dtype=BF16),
        torch.zeros(4, 16, 2, 128, device=DEV, dtype=BF16),
    )
    slots = torch.randperm(64, device=DEV)[:20]
    attention.store_kv(k, k, kc, vc, slots)
    kr, vr = kc.cpu().clone().zero_(), vc.cpu().clone().zero_()
    attn_naive.store_kv(k.cpu(), k.cpu(), kr, vr, slots.cpu())
    record("check", "attention.store_kv", out=rel(kc, kr) + rel(vc, vr))


def main() -> None:
    steps = {
        f.__name__: f for f in (check_recurrent, check_attention, time_conv, time_recurrent, time_attention)
    }
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", default=",".join(steps), help="comma-separated subset of " + ", ".join(steps)
    )
    parser.add_argument("--sweep", action="store_true", help="time several attention tilings")
    args = parser.parse_args()
    print("torch", torch.__version__, torch.cuda.get_device_name(), flush=True)
    for name in args.steps.split(","):
        try:
            steps[name](args.sweep) if name == "time_attention" else steps[name]()
        except Exception as e:  # keep the other steps' numbers
            traceback.print_exc()
            record("error", name, error=repr(e)[:400])
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "ops_check.json"), "w") as f:
        json.dump(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1
        )
    print("\n| kind | name | values |\n|---|---|---|")
    for r in rows:
        vals = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in r.items()
            if k not in ("kind", "name")
        )
        print(f"| {r['kind']} | {r['name']} | {vals} |")
    sys.exit(1 if any(r["kind"] == "error" for r in rows) else 0)


if __name__ == "__main__":
    main()
