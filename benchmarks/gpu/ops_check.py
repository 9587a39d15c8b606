"""GPU ops against their CPU oracles, then op-level timings on the card. One call, one table.

    PYTHONPATH=. python benchmarks/gpu/ops_check.py        # on the device machine; writes $OUT/ops_check.json
    PYTHONPATH=. python benchmarks/gpu/ops_check.py --steps time_recurrent   # one part only
    PYTHONPATH=. python benchmarks/gpu/ops_check.py --sweep                  # also try attention tilings

Correctness: every GPU backend (FLA gated delta rule / KDA / SSD, Triton conv, Triton paged attention)
runs a small varlen batch (fresh and pooled initial states, GQA, exports inside chunks, decode) in bf16,
and the naive op runs the same bf16 inputs on the CPU in fp32; ‖gpu − ref‖ / ‖ref‖ per output.
Timing: `triton.testing.do_bench` medians at 32k-token prefill and 32k-context decode shapes.
"""

# ruff: noqa: B023  (every lambda is timed at once, inside its loop iteration)
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).parent))

from engine_setup import attention_flops  # noqa: E402

from flashstate.ops import attention, gated_delta_rule, kda, short_conv, ssd  # noqa: E402
from flashstate.ops.attention import naive as attn_naive
from flashstate.ops.attention.triton import paged_attention as triton_paged_attention
from flashstate.ops.gated_delta_rule import naive as gdn_naive
from flashstate.ops.kda import naive as kda_naive
from flashstate.ops.pooled import chunk_offsets
from flashstate.ops.pooled_triton import states_at_exports_fused
from flashstate.ops.short_conv import naive as conv_naive
from flashstate.ops.ssd import naive as ssd_naive

DEV = "cuda"
BF16 = torch.bfloat16
rows: list[dict] = []


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if not torch.isfinite(a).all():
        return float("nan")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def record(kind: str, name: str, **values) -> None:
    rows.append({"kind": kind, "name": name, **values})
    print(kind, name, json.dumps(values), flush=True)


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


def paged_setup(q_lens, ctx, hq, hkv, d, dv, page=16, dtype=BF16, device=DEV):
    n = len(q_lens)
    nb = sum(-(-c // page) for c in ctx) + 4
    kc = torch.randn(nb, page, hkv, d, device=device, dtype=dtype)
    vc = torch.randn(nb, page, hkv, dv, device=device, dtype=dtype)
    perm = torch.randperm(nb, device=device)
    width = max(-(-c // page) for c in ctx)
    table = torch.zeros(n, width, dtype=torch.int32, device=device)
    j = 0
    for i, c in enumerate(ctx):
        k = -(-c // page)
        table[i, :k] = perm[j : j + k]
        j += k
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = torch.randn(int(cu[-1]), hq, d, device=device, dtype=dtype)
    return q, kc, vc, cu, torch.tensor(ctx, dtype=torch.int32, device=device), table


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


def ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_conv() -> None:
    """The short conv at a 32k-token prefill (its tile is autotuned per shape: the chosen one is recorded)."""
    from flashstate.ops.short_conv.triton import _conv_kernel

    t = 32768
    cu = torch.tensor([0, t], dtype=torch.int32, device=DEV)
    idx, has = torch.tensor([0], device=DEV), torch.tensor([True], device=DEV)
    xc = torch.randn(t, 8192, device=DEV, dtype=BF16)
    w = torch.randn(8192, 4, device=DEV)
    cpool = torch.randn(2, 8192, 3, device=DEV, dtype=BF16)
    conv = ms(
        lambda: short_conv.causal_conv1d(
            xc, w, None, conv_state_pool=cpool, state_indices=idx, has_initial_state=has, cu_seqlens=cu
        )
    )
    best = getattr(_conv_kernel, "best_config", None)
    record(
        "time", "short_conv.32k_d8192_k4", ms=conv, gb_per_s=2 * xc.numel() * 2 / conv / 1e6, tile=str(best)
    )


def time_recurrent() -> None:
    torch.manual_seed(2)
    t, h, d = 32768, 16, 128
    cu = torch.tensor([0, t], dtype=torch.int32, device=DEV)
    idx, has = torch.tensor([0], device=DEV), torch.tensor([True], device=DEV)
    exports = torch.tensor([5000, 12345, 20000, 32000], device=DEV)
    q, k, v = (torch.randn(1, t, h, d, device=DEV, dtype=BF16) for _ in range(3))
    beta = torch.rand(1, t, h, device=DEV, dtype=BF16)
    g = F.logsigmoid(torch.randn(1, t, h, device=DEV)) * 0.5
    gk = F.logsigmoid(torch.randn(1, t, h, d, device=DEV)) * 0.5
    pool = torch.randn(2, h, d, d, device=DEV) * 0.1
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    from fla.ops.kda import chunk_kda as fla_kda

    for name, op, gate, fla_op in [
        ("gdn", gated_delta_rule.chunk_gated_delta_rule, g, fla_gdn),
        ("kda", kda.chunk_kda, gk, fla_kda),
    ]:
        common = dict(
            state_pool=pool,
            state_indices=idx,
            has_initial_state=has,
            cu_seqlens=cu,
            use_qk_l2norm_in_kernel=True,
        )
        base = ms(lambda: op(q, k, v, gate, beta, **common))
        with_exp = ms(lambda: op(q, k, v, gate, beta, **common, export_token_ids=exports))
        h0 = pool[:1].clone()
        fla = ms(
            lambda: fla_op(
                q,
                k,
                v,
                gate,
                beta,
                initial_state=h0,
                output_final_state=True,
                cu_seqlens=cu.long(),
                use_qk_l2norm_in_kernel=True,
            )
        )
        # the export kernel alone on tensors of the pass's shapes (GPU time, free of host overhead)
        cu_long = cu.long()
        h_all = torch.randn(1, t // 64, h, d, d, device=DEV, dtype=BF16)
        g_cum = gate.cumsum(1).contiguous()
        export_only = ms(
            lambda: states_at_exports_fused(
                h_all, k, v, g_cum, cu_long, chunk_offsets(cu_long, 64), exports, 64, torch.float32
            )
        )
        record(
            "time",
            f"{name}.chunk.32k_h16_d128",
            ms=base,
            ms_4_exports=with_exp,
            export_overhead_pct=100 * (with_exp - base) / base,
            export_kernel_ms=export_only,
            export_kernel_pct=100 * export_only / base,
            fla_public_ms=fla,
        )

    hs, p, n_state, groups = 64, 64, 128, 8
    x = torch.randn(1, t, hs, p, device=DEV, dtype=BF16)
    dt = torch.randn(1, t, hs, device=DEV, dtype=BF16) - 2
    a = -torch.rand(hs, device=DEV) * 4
    b, c = (torch.randn(1, t, groups, n_state, device=DEV, dtype=BF16) for _ in range(2))
    dd, bias = torch.randn(hs, device=DEV), torch.randn(hs, device=DEV) * 0.1
    spool = torch.randn(2, hs, p, n_state, device=DEV) * 0.1
    common = dict(dt_bias=bias, state_pool=spool, state_indices=idx, has_initial_state=has, cu_seqlens=cu)
    base = ms(lambda: ssd.chunk_ssd(x, dt, a, b, c, dd, **common))
    with_exp = ms(lambda: ssd.chunk_ssd(x, dt, a, b, c, dd, **common, export_token_ids=exports))
    record(
        "time",
        "ssd.chunk.32k_h64_p64_n128_g8",
        ms=base,
        ms_4_exports=with_exp,
        export_overhead_pct=100 * (with_exp - base) / base,
    )

    for batch in (1, 16, 64):
        dcu = torch.arange(batch + 1, dtype=torch.int32, device=DEV)
        didx = torch.randperm(batch * 2, device=DEV)[:batch]
        dhas = torch.ones(batch, dtype=torch.bool, device=DEV)
        hv = 32
        dpool = torch.randn(batch * 2, hv, d, d, device=DEV) * 0.1
        dq, dk = (torch.randn(1, batch, h, d, device=DEV, dtype=BF16) for _ in range(2))
        dv = torch.randn(1, batch, hv, d, device=DEV, dtype=BF16)
        dg = F.logsigmoid(torch.randn(1, batch, hv, device=DEV))
        db = torch.rand(1, batch, hv, device=DEV, dtype=BF16)
        dec = ms(
            lambda: gated_delta_rule.fused_recurrent_gated_delta_rule(
                dq,
                dk,
                dv,
                dg,
                db,
                state_pool=dpool,
                state_indices=didx,
                has_initial_state=dhas,
                cu_seqlens=dcu,
                use_qk_l2norm_in_kernel=True,
            )
        )
        state_bytes = 2 * batch * hv * d * d * 4
        record("time", f"gdn.decode.b{batch}_hv32_d128", ms=dec, state_gb_per_s=state_bytes / dec / 1e6)
        sp = torch.randn(batch * 2, hs, p, n_state, device=DEV) * 0.1
        sx = torch.randn(1, batch, hs, p, device=DEV, dtype=BF16)
        sdt = torch.randn(1, batch, hs, device=DEV, dtype=BF16)
        sb, sc = (torch.randn(1, batch, groups, n_state, device=DEV, dtype=BF16) for _ in range(2))
        sdec = ms(
            lambda: ssd.fused_recurrent_ssd(
                sx,
                sdt,
                a,
                sb,
                sc,
                dd,
                dt_bias=bias,
                state_pool=sp,
                state_indices=didx,
                has_initial_state=dhas,
                cu_seqlens=dcu,
            )
        )
        state_bytes = 2 * batch * hs * p * n_state * 4
        record("time", f"ssd.decode.b{batch}_h64_p64_n128", ms=sdec, state_gb_per_s=state_bytes / sdec / 1e6)


def time_attention(sweep: bool = False) -> None:
    torch.manual_seed(3)
    hq, hkv, d = 32, 8, 128
    for t in (8192, 32768):
        q, kc, vc, cu, cl, bt = paged_setup([t], [t], hq, hkv, d, d)
        flops = attention_flops([t], [t], hq, d, d)
        qs = q.view(1, t, hq, d).transpose(1, 2)
        ks = torch.randn(1, hkv, t, d, device=DEV, dtype=BF16)
        vs = torch.randn(1, hkv, t, d, device=DEV, dtype=BF16)
        sdpa = ms(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True))
        best = None
        configs = [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3)] if sweep else []
        for bm, bn, warps, stages in configs:
            try:
                tm = ms(
                    lambda: triton_paged_attention(
                        q,
                        kc,
                        vc,
                        cu_seqlens=cu,
                        context_lens=cl,
                        block_tables=bt,
                        scale=d**-0.5,
                        block_m=bm,
                        block_n=bn,
                        num_warps=warps,
                        num_stages=stages,
                    )
                )
            except Exception as e:  # a config can run out of shared memory
                print("config", bm, bn, warps, stages, "failed:", str(e)[:120])
                continue
            record(
                "time", f"attention.prefill.{t}_cfg{bm}x{bn}w{warps}s{stages}", ms=tm, tflops=flops / tm / 1e9
            )
            best = tm if best is None else min(best, tm)
        default = ms(
            lambda: attention.paged_attention(
                q, kc, vc, cu_seqlens=cu, context_lens=cl, block_tables=bt, scale=d**-0.5
            )
        )
        record(
            "time",
            f"attention.prefill.{t}",
            ms=default,
            tflops=flops / default / 1e9,
            best_cfg_tflops=flops / best / 1e9 if best else None,
            sdpa_ms=sdpa,
            sdpa_tflops=flops / sdpa / 1e9,
        )
    q, kc, vc, cu, cl, bt = paged_setup([4096], [32768], hq, hkv, d, d)
    tm = ms(
        lambda: attention.paged_attention(
            q, kc, vc, cu_seqlens=cu, context_lens=cl, block_tables=bt, scale=d**-0.5
        )
    )
    record(
        "time",
        "attention.prefill.4k_over_28k_prefix",
        ms=tm,
        tflops=attention_flops([4096], [32768], hq, d, d) / tm / 1e9,
    )
    q, kc, vc, cu, cl, bt = paged_setup([8192], [8192], 32, 32, 192, 128)
    tm = ms(
        lambda: attention.paged_attention(
            q, kc, vc, cu_seqlens=cu, context_lens=cl, block_tables=bt, scale=192**-0.5
        )
    )
    record(
        "time",
        "attention.prefill_mla.8k_h32_d192_dv128",
        ms=tm,
        tflops=attention_flops([8192], [8192], 32, 192, 128) / tm / 1e9,
    )
    for batch in (1, 16, 64):
        q, kc, vc, cu, cl, bt = paged_setup([1] * batch, [32768] * batch, hq, hkv, d, d)
        tm = ms(
            lambda: attention.paged_attention(
                q, kc, vc, cu_seqlens=cu, context_lens=cl, block_tables=bt, scale=d**-0.5
            )
        )
        kv_bytes = 2 * batch * 32768 * hkv * d * 2
        record("time", f"attention.decode.b{batch}_ctx32k", ms=tm, kv_gb_per_s=kv_bytes / tm / 1e6)


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
