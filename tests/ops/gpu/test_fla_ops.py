"""The FLA-backed recurrent ops against their naive oracles (CUDA and flash-linear-attention only; CI skips).
bf16 inputs on the GPU, the same inputs in fp32 on the CPU for the oracle; FLA's bf16 intermediates put
outputs near 4e-3 and states near 2e-3 relative (see docs/history/benchmarks-2026-11.md, GPU ops)."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("fla")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from flashstate.ops import gated_delta_rule, kda, ssd  # noqa: E402
from flashstate.ops.gated_delta_rule import naive as gdn_naive  # noqa: E402
from flashstate.ops.kda import naive as kda_naive  # noqa: E402
from flashstate.ops.ssd import naive as ssd_naive  # noqa: E402

BF16 = torch.bfloat16
PREFILL = (
    [300, 1, 77, 130],
    [5, 2, 0, 7],
    [False, True, False, True],
    [0, 63, 64, 200, 299, 300, 301, 377, 500],
)
DECODE = ([1] * 5, [5, 2, 0, 7, 3], [False, True, False, False, True], [1, 3])


def rel(a, b):
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())


def _meta(lens, slots, fresh, exports, device):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return dict(
        cu_seqlens=cu,
        state_indices=torch.tensor(slots, device=device),
        has_initial_state=~torch.tensor(fresh, device=device),
        export_token_ids=torch.tensor(exports, device=device),
    )


def _compare(gpu_op, cpu_op, inputs, pool, batch, **kw):
    pg, pc = pool.cuda(), pool.clone()
    og, eg = gpu_op(*[x.cuda() for x in inputs], state_pool=pg, **_meta(*batch, "cuda"), **kw)
    oc, ec = cpu_op(*inputs, state_pool=pc, **_meta(*batch, "cpu"), **kw)
    return rel(og, oc), rel(pg, pc), rel(eg, ec)


@pytest.mark.parametrize("batch", [PREFILL, DECODE], ids=["prefill", "decode"])
@pytest.mark.parametrize("form", ["chunk", "fused_recurrent"])
def test_gated_delta_rule_matches_oracle(batch, form):
    torch.manual_seed(0)
    t = sum(batch[0])
    inputs = [
        torch.randn(1, t, 2, 64).to(BF16),
        torch.randn(1, t, 2, 64).to(BF16),
        torch.randn(1, t, 4, 64).to(BF16),
        F.logsigmoid(torch.randn(1, t, 4)) * 0.5,
        torch.rand(1, t, 4).to(BF16),
    ]
    name = f"{form}_gated_delta_rule"
    o, p, e = _compare(
        getattr(gated_delta_rule, name),
        getattr(gdn_naive, name),
        inputs,
        torch.randn(8, 4, 64, 64) * 0.1,
        batch,
        use_qk_l2norm_in_kernel=True,
    )
    assert o < 1e-2 and p < 5e-3 and e < 5e-3


@pytest.mark.parametrize("batch", [PREFILL, DECODE], ids=["prefill", "decode"])
@pytest.mark.parametrize("form", ["chunk", "fused_recurrent"])
def test_kda_matches_oracle(batch, form):
    torch.manual_seed(1)
    t = sum(batch[0])
    inputs = [torch.randn(1, t, 4, 64).to(BF16) for _ in range(3)]
    inputs += [F.logsigmoid(torch.randn(1, t, 4, 64)) * 0.5, torch.rand(1, t, 4).to(BF16)]
    name = f"{form}_kda"
    o, p, e = _compare(
        getattr(kda, name),
        getattr(kda_naive, name),
        inputs,
        torch.randn(8, 4, 64, 64) * 0.1,
        batch,
        use_qk_l2norm_in_kernel=True,
    )
    assert o < 1e-2 and p < 5e-3 and e < 5e-3


@pytest.mark.parametrize("batch", [PREFILL, DECODE], ids=["prefill", "decode"])
@pytest.mark.parametrize("form", ["chunk", "fused_recurrent"])
def test_ssd_matches_oracle(batch, form):
    torch.manual_seed(2)
    t = sum(batch[0])
    inputs = [
        torch.randn(1, t, 8, 32).to(BF16),
        torch.randn(1, t, 8).to(BF16) - 1.0,
        -torch.rand(8) * 4,
        torch.randn(1, t, 2, 64).to(BF16),
        torch.randn(1, t, 2, 64).to(BF16),
        torch.randn(8),
    ]
    bias = torch.randn(8) * 0.1
    name = f"{form}_ssd"
    pool = torch.randn(8, 8, 32, 64) * 0.1
    pg, pc = pool.cuda(), pool.clone()
    yg, eg = getattr(ssd, name)(
        *[x.cuda() for x in inputs],
        dt_bias=bias.cuda(),
        dt_limit=(0.0, 4.0),
        state_pool=pg,
        **_meta(*batch, "cuda"),
    )
    yc, ec = getattr(ssd_naive, name)(
        *inputs, dt_bias=bias, dt_limit=(0.0, 4.0), state_pool=pc, **_meta(*batch, "cpu")
    )
    assert rel(yg, yc) < 1e-2 and rel(pg, pc) < 5e-3 and rel(eg, ec) < 5e-3


def test_the_metadatas_chunk_indices_are_flas_and_change_no_result():
    """ForwardMetadata builds FLA's chunk list on the host (no read-back of the lengths); each chunked op
    given it computes exactly what it computes deriving the list itself."""
    from fla.ops.utils.index import prepare_chunk_indices

    from flashstate.layers.metadata import ForwardMetadata

    lens = PREFILL[0]
    tables = [[0] * -(-n // 16) for n in lens]
    built = ForwardMetadata.build(lens, lens, tables, 16, list(range(len(lens))), device="cuda")
    chunks = built.chunk_indices
    meta = _meta(*PREFILL, "cuda")
    assert torch.equal(chunks, prepare_chunk_indices(meta["cu_seqlens"].long(), 64))
    torch.manual_seed(3)
    t = sum(lens)
    gdn = [torch.randn(1, t, 2, 64), torch.randn(1, t, 2, 64), torch.randn(1, t, 4, 64)]
    gdn = [x.to(BF16).cuda() for x in gdn] + [(F.logsigmoid(torch.randn(1, t, 4)) * 0.5).cuda(),
                                               torch.rand(1, t, 4).to(BF16).cuda()]  # fmt: skip
    kda_in = [torch.randn(1, t, 4, 64).to(BF16).cuda() for _ in range(3)]
    kda_in += [(F.logsigmoid(torch.randn(1, t, 4, 64)) * 0.5).cuda(), torch.rand(1, t, 4).to(BF16).cuda()]
    ssd_in = [torch.randn(1, t, 8, 32).to(BF16), torch.randn(1, t, 8).to(BF16) - 1.0, -torch.rand(8) * 4]
    ssd_in += [torch.randn(1, t, 2, 64).to(BF16), torch.randn(1, t, 2, 64).to(BF16), torch.randn(8)]
    ssd_in = [x.cuda() for x in ssd_in]
    cases = [
        (gated_delta_rule.chunk_gated_delta_rule, gdn, (4, 64, 64), dict(use_qk_l2norm_in_kernel=True)),
        (kda.chunk_kda, kda_in, (4, 64, 64), dict(use_qk_l2norm_in_kernel=True)),
        (ssd.chunk_ssd, ssd_in, (8, 32, 64), dict(dt_bias=torch.randn(8).cuda(), dt_limit=(0.0, 4.0))),
    ]
    for op, inputs, state, kw in cases:
        pool = torch.randn(8, *state).cuda() * 0.1
        runs = []
        for given in (None, chunks):
            p = pool.clone()
            out, exported = op(*inputs, state_pool=p, **meta, chunk_indices=given, **kw)
            runs.append((out, p, exported))
        for a, b in zip(*runs, strict=True):
            assert torch.equal(a, b), op.__name__


def test_fla_index_helpers_are_recomputed_while_the_tensor_cache_is_off():
    from fla.ops.utils.index import prepare_chunk_offsets

    from flashstate.ops.fla_cache import fla_tensor_cache_off

    cu = torch.tensor([0, 70, 200], dtype=torch.long, device="cuda")
    cached = prepare_chunk_offsets(cu, 64)
    assert prepare_chunk_offsets(cu, 64) is cached  # FLA's memo, by the identity of cu
    with fla_tensor_cache_off():
        fresh = prepare_chunk_offsets(cu, 64)
    assert fresh is not cached and torch.equal(fresh, cached)
    assert fresh.tolist() == [0, 2, 5]
