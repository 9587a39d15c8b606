"""Compile every Triton kernel of flashstate.ops for Hopper (sm_90) without a GPU: catches type and
shape errors before spending device time, and reports shared memory, wgmma (Hopper matrix instructions)
and cp.async (pipelined loads) counts from the PTX. Needs `triton` installed.

    PYTHONPATH=. python benchmarks/gpu/compile_check.py      # exit status 1 if any kernel fails
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET"):
    sys.exit("unset TRITON_INTERPRET: the interpreter does not compile")

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flashstate.ops.activation.triton import _sigmoid_mul_kernel, _silu_mul_kernel
from flashstate.ops.attention.triton import _merge_splits_kernel, _paged_attention_kernel
from flashstate.ops.gated_delta_rule.decode_triton import BV as GDN_BV
from flashstate.ops.gated_delta_rule.decode_triton import _gdn_decode_kernel
from flashstate.ops.gdn_gating.triton import _gdn_gating_kernel
from flashstate.ops.norm.triton import _rms_norm_kernel
from flashstate.ops.pooled_triton import _export_kernel, _zero_fresh_kernel
from flashstate.ops.qk_norm_rope.triton import _qk_norm_rope_store_kernel
from flashstate.ops.rotary.triton import _rotary_kernel
from flashstate.ops.short_conv.triton import _CONV_CONFIGS, _conv_kernel, _conv_update_kernel, _window_kernel
from flashstate.ops.ssd.decode_triton import _ssd_decode_kernel

TARGET = GPUTarget("cuda", 90, 64)


def build(
    fn, pointers: dict[str, str], constants: dict, scalars: dict[str, str] | None = None, **options
) -> bool:
    """Arguments not named are i32 scalars; an autotuned kernel is built as its JIT function."""
    if isinstance(fn, triton.runtime.Autotuner):
        fn = fn.fn
    names = fn.arg_names
    types = {**(scalars or {}), **pointers}
    signature = {n: "constexpr" if n in constants else types.get(n, "i32") for n in names}
    # as the JIT specialises at run time: pointers and strides divisible by 16 (16-byte loads legal)
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if n in pointers or (n.startswith("stride") and n not in constants)
    }
    source = ASTSource(
        fn=fn,
        signature=signature,
        constexprs={(names.index(k),): v for k, v in constants.items()},
        attrs=aligned,
    )
    label = f"{fn.__name__} {dict(sorted(constants.items()))}"
    try:
        kernel = triton.compile(source, target=TARGET, options=options)
    except Exception as e:  # report every failing kernel, not only the first
        print("FAIL", label, "\n", str(e)[:2000])
        return False
    ptx = kernel.asm.get("ptx", "")
    print(
        f"ok   {label[:150]}  shared={kernel.metadata.shared} wgmma={ptx.count('wgmma.mma_async')} "
        f"cp.async={ptx.count('cp.async.cg') + ptx.count('cp.async.ca')}"
    )
    return True


def main() -> None:
    ok = []
    export = dict(
        h="*bf16",
        k="*bf16",
        v_new="*bf16",
        g_cum="*fp32",
        cu_seqlens="*i64",
        chunk_offsets="*i64",
        export_ids="*i64",
        out="*fp32",
    )
    ok.append(
        build(
            _export_kernel,
            export,
            dict(H=16, HV=16, K=128, V=128, C=64, BK=128, BV=32, BLOCK_N=1, PER_CHANNEL=True, V_FIRST=False),
        )
    )
    ok.append(
        build(
            _export_kernel,
            export,
            dict(H=16, HV=32, K=128, V=64, C=64, BK=128, BV=32, BLOCK_N=4, PER_CHANNEL=False, V_FIRST=True),
        )
    )
    ok.append(
        build(_zero_fresh_kernel, dict(pool="*fp32", indices="*i64", has_initial="*i1"), dict(BLOCK=4096))
    )
    ok.append(
        build(
            _merge_splits_kernel, dict(part_acc="*fp32", part_ml="*fp32", out="*bf16"), dict(DV=128, BDV=128)
        )
    )
    attn = dict(
        q="*bf16",
        k_cache="*bf16",
        v_cache="*bf16",
        out="*bf16",
        part_acc="*fp32",
        part_ml="*fp32",
        cu_seqlens="*i64",
        context_lens="*i32",
        block_tables="*i32",
        tile_seq="*i32",
        tile_tok="*i32",
    )
    # the launcher's tiles for: GQA 128 (decode, prefill), per-head 192/128, MLA's latent 576/512 (one
    # shared KV head, 32 query heads: decode and prefill as the 2B Kimi preset gets them in bf16)
    for decode, split, g, d, dv, bd, bd2, bm, bn, warps, stages in [
        (True, True, 4, 128, 128, 128, 0, 16, 64, 4, 3),
        (False, False, 4, 128, 128, 128, 0, 128, 128, 8, 3),
        (False, False, 1, 192, 128, 256, 0, 128, 64, 8, 2),
        (True, True, 1, 192, 128, 256, 0, 16, 64, 4, 2),
        (True, True, 32, 576, 512, 512, 64, 32, 32, 8, 2),
        (False, False, 32, 576, 512, 512, 64, 64, 16, 8, 2),
    ]:
        ok.append(
            build(
                _paged_attention_kernel,
                attn,
                dict(
                    G=g,
                    PAGE=16,
                    D=d,
                    DV=dv,
                    BD=bd,
                    BD2=bd2,
                    BDV=dv,
                    BM=bm,
                    BN=bn,
                    SPLIT=split,
                    DECODE=decode,
                ),
                scalars=dict(qk_scale="fp32"),
                num_warps=warps,
                num_stages=stages,
            )
        )
    conv = dict(
        x="*bf16",
        weight="*fp32",
        bias="*fp32",
        y="*bf16",
        pool="*bf16",
        seq_of_token="*i64",
        cu_seqlens="*i64",
        indices="*i64",
        has_initial="*i1",
    )
    for config in _CONV_CONFIGS:  # every autotuned tile (warps do not change what compiles)
        if config.num_warps == 4:
            ok.append(build(_conv_kernel, conv, dict(K=4, HAS_BIAS=True, SILU=True, **config.kwargs)))
    update = {k: v for k, v in conv.items() if k not in ("seq_of_token", "cu_seqlens")}
    constants = dict(K=4, KP=4, HAS_BIAS=True, SILU=True, BD=256)
    ok.append(build(_conv_update_kernel, update, constants, num_warps=4))
    norm = dict(x_ptr="*bf16", z_ptr="*bf16", r_ptr="*bf16", w_ptr="*bf16", y_ptr="*bf16", s_ptr="*bf16")
    for gated, residual, block in [
        (False, False, 2048),
        (True, False, 128),
        (False, True, 2048),
        (False, False, 256),
    ]:
        rows = max(2048 // block, 1)
        ok.append(
            build(
                _rms_norm_kernel,
                norm,
                dict(GATED=gated, RESIDUAL=residual, ROWS=rows, BLOCK=block),
                scalars=dict(eps="fp32", offset="fp32"),
                num_warps=min(max(block * rows // 256, 1), 8),
            )
        )
    ok.append(
        build(_rotary_kernel, dict(x="*bf16", cos="*bf16", sin="*bf16"), dict(BHALF=32, BH=16), num_warps=4)
    )
    ok.append(build(_silu_mul_kernel, dict(gate_up="*bf16", out="*bf16"), dict(BLOCK=1024), num_warps=4))
    gated = dict(x="*bf16", gate="*bf16", out="*bf16")
    ok.append(build(_sigmoid_mul_kernel, gated, dict(BLOCK=256), num_warps=2))
    gating = dict(a="*bf16", b="*bf16", A_log="*fp32", dt_bias="*bf16", g="*fp32", beta="*bf16")
    for bt in (1, 64):  # a one-token decode row, a prefill tile
        ok.append(build(_gdn_gating_kernel, gating, dict(BT=bt, BH=32), num_warps=4))
    window = dict(
        x="*bf16",
        pool="*fp32",
        out="*fp32",
        seq_of_row="*i64",
        last_of_row="*i64",
        cu_seqlens="*i64",
        indices="*i64",
        has_initial="*i1",
    )
    for row_is_seq in (False, True):
        ok.append(build(_window_kernel, window, dict(W=3, ROW_IS_SEQ=row_is_seq, BD=256)))
    ssd = dict(
        x="*bf16",
        dt="*bf16",
        A="*fp32",
        B="*bf16",
        C="*bf16",
        D="*fp32",
        dt_bias="*fp32",
        y="*bf16",
        pool="*fp32",
        indices="*i64",
        has_initial="*i1",
    )
    ok.append(
        build(
            _ssd_decode_kernel,
            ssd,
            dict(
                HEADS_PER_GROUP=8, H=64, P=64, N=128, BP=32, BN=128, HAS_D=True, HAS_BIAS=True, SOFTPLUS=True
            ),
            scalars=dict(dt_lo="fp32", dt_hi="fp32"),
        )
    )
    rows = ("q", "k", "v", "q_weight", "k_weight", "q_out", "k_cache", "v_cache", "cos", "sin")
    prep = dict.fromkeys(rows, "*bf16") | {"slots": "*i64"}
    constants = dict(BLOCK=256, BHALF=32, BLOCK_V=256)
    ok.append(build(_qk_norm_rope_store_kernel, prep, constants, scalars=dict(eps="fp32", offset="fp32")))
    gdn = {n: "*bf16" for n in ("q", "k", "v", "a", "b", "dt_bias", "o")}
    gdn.update(A_log="*fp32", pool="*fp32", indices="*i64", has_initial="*i1")
    constants = dict(H=16, HV=32, K=128, V=128, BK=128, BV=GDN_BV, L2NORM=True)
    ok.append(build(_gdn_decode_kernel, gdn, constants, scalars=dict(scale="fp32"), num_warps=4))
    print(f"{sum(ok)}/{len(ok)} kernels compiled for sm_90")
    sys.exit(0 if all(ok) else 1)


if __name__ == "__main__":
    main()
