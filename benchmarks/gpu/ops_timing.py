"""Op-level timings on the card (`triton.testing.do_bench` medians) at 32k-token prefill and 32k-context
decode shapes; run through ops_check.py (`--steps time_conv,time_recurrent,time_attention`)."""

# ruff: noqa: B023  (every lambda is timed at once, inside its loop iteration)
from __future__ import annotations

import torch
import torch.nn.functional as F
from engine_setup import attention_flops
from ops_common import BF16, DEV, ms, paged_setup, record

from flashstate.ops import attention, gated_delta_rule, kda, short_conv, ssd
from flashstate.ops.attention.triton import paged_attention as triton_paged_attention
from flashstate.ops.pooled import chunk_offsets
from flashstate.ops.pooled_triton import states_at_exports_fused


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
        # the model's decode step: the gates, the in-place pooled state update and the output in one kernel
        ga, gb = (torch.randn(batch, hv, device=DEV, dtype=BF16) for _ in range(2))
        a_log, gbias = torch.randn(hv, device=DEV), torch.randn(hv, device=DEV)
        fused = ms(
            lambda: gated_delta_rule.decode_gated_delta_rule_in_place(
                dq,
                dk,
                dv,
                ga,
                gb,
                a_log,
                gbias,
                state_pool=dpool,
                state_indices=didx,
                has_initial_state=dhas,
                use_qk_l2norm_in_kernel=True,
            )
        )
        state_bytes = 2 * batch * hv * d * d * 4
        record(
            "time",
            f"gdn.decode.b{batch}_hv32_d128",
            ms=dec,
            state_gb_per_s=state_bytes / dec / 1e6,
            fused_in_place_ms=fused,
            fused_state_gb_per_s=state_bytes / fused / 1e6,
        )
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
