"""The fused MoE (ops/moe/triton.py) against the oracle on CUDA (skipped without it): several token counts,
expert counts, top-k, widths and dtypes; every family's MoE block against its reference-ops forward; and a
MoE block captured in a CUDA graph and replayed on new inputs."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import flashstate.ops.backend as backend_module  # noqa: E402
from flashstate.models.kimi_linear import SparseMoe  # noqa: E402
from flashstate.models.nemotron_h import MoE as NemotronMoe  # noqa: E402
from flashstate.models.qwen3_next import Qwen3NextSparseMoeBlock  # noqa: E402
from flashstate.ops.moe import Experts, naive, softmax_topk  # noqa: E402
from flashstate.ops.moe import triton as moe_triton  # noqa: E402
from flashstate.spec.model_spec import MoeSpec  # noqa: E402

DEV = "cuda"


def _rel(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _case(t, e, k, d, i, gated, act, dtype, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(t, d, device=DEV, generator=g).to(dtype)
    w_in = (torch.randn(e, 2 * i if gated else i, d, device=DEV, generator=g) / d**0.5).to(dtype)
    w_out = (torch.randn(e, d, i, device=DEV, generator=g) / i**0.5).to(dtype)
    weights, ids = softmax_topk(torch.randn(t, e, device=DEV, generator=g), k, renormalize=True)
    return x, weights, ids, Experts(w_in, w_out, act, gated)


def _oracle(x, weights, ids, ex):
    wide = Experts(ex.w_in.double(), ex.w_out.double(), ex.act, ex.gated)
    return naive.moe_experts(x.double(), weights.double(), ids, wide)


SHAPES = [(t, e, k) for t in (1, 7, 64, 1000) for e, k in ((8, 2), (64, 6), (128, 8))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("t", "e", "k"), SHAPES)
def test_fused_experts_match_the_oracle(t, e, k, dtype):
    for d, i, gated, act in [(128, 96, True, "silu"), (256, 64, False, "relu2")]:
        x, weights, ids, ex = _case(t, e, k, d, i, gated, act, dtype, seed=t * e + k)
        got = moe_triton.moe_experts(x, weights, ids, ex)
        assert got.shape == x.shape and got.dtype == dtype and torch.isfinite(got).all()
        assert _rel(got, _oracle(x, weights, ids, ex)) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize(("t", "e", "k", "d", "i"), [(1, 512, 10, 2048, 512), (64, 256, 8, 2048, 512),
                                                     (1000, 128, 8, 2048, 768)])  # fmt: skip
def test_fused_experts_at_real_widths(t, e, k, d, i):
    x, weights, ids, ex = _case(t, e, k, d, i, True, "silu", torch.bfloat16, seed=7)
    assert _rel(moe_triton.moe_experts(x, weights, ids, ex), _oracle(x, weights, ids, ex)) < 1e-2


def test_strided_rows_and_odd_widths():
    x, weights, ids, ex = _case(37, 16, 4, 200, 72, True, "silu", torch.bfloat16, seed=3)
    wide = torch.cat([x, x], dim=1)[:, :200]  # rows strided
    got = moe_triton.moe_experts(wide, weights, ids, ex)
    assert _rel(got, _oracle(x, weights, ids, ex)) < 1e-2
    empty = moe_triton.moe_experts(x[:0], weights[:0], ids[:0], ex)
    assert empty.shape == (0, 200)


ALIGN_SHAPES = [(1, 10, 512, 16), (16, 10, 512, 16), (48, 8, 256, 16), (7, 2, 8, 32), (100, 10, 64, 64),
                (3, 6, 1000, 16)]  # fmt: skip


@pytest.mark.parametrize(("t", "k", "e", "block"), ALIGN_SHAPES)
def test_the_one_cta_alignment_equals_the_torch_one(t, k, e, block):
    from flashstate.ops.moe.align import align_assignments

    ids = torch.rand(t, e, device=DEV).topk(k, -1).indices
    got, want = moe_triton.align(ids, e, block), align_assignments(ids, e, block)
    assert t * k <= moe_triton.SMALL_ALIGN
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _spec(**kw):
    base = dict(num_experts=64, top_k=6, intermediate_size=96, shared_intermediate_size=128,
                num_shared_experts=1, norm_topk_prob=True, act="silu")  # fmt: skip
    return MoeSpec(**{**base, **kw})


def _blocks():
    sigmoid = dict(
        scoring="sigmoid", n_group=8, topk_group=4, routed_scaling_factor=2.5, correction_bias=True
    )
    yield "qwen3_next", Qwen3NextSparseMoeBlock(256, _spec(shared_expert_gate=True))
    yield "kimi", SparseMoe(256, _spec(**sigmoid))
    yield "nemotron", NemotronMoe(256, _spec(act="relu2", latent_size=128, **sigmoid), bias=False)


@pytest.mark.parametrize("name", ["qwen3_next", "kimi", "nemotron"])
def test_each_familys_block_matches_its_reference_forward(name, monkeypatch):
    torch.manual_seed(0)
    block = dict(_blocks())[name]
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.05)
    block = block.to(DEV, torch.bfloat16)
    x = torch.randn(50, 256, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        fused = block(x)
        monkeypatch.setattr(backend_module, "_reference", True)
        reference = block(x)
    assert _rel(fused, reference) < 2e-2


def test_a_moe_block_replays_in_a_cuda_graph():
    torch.manual_seed(1)
    block = Qwen3NextSparseMoeBlock(256, _spec(shared_expert_gate=True))
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.05)
    block = block.to(DEV, torch.bfloat16)
    static = torch.randn(16, 256, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        block(static)  # compiles the kernels outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = block(static)
        for seed in range(3):
            fresh = torch.randn(
                16, 256, device=DEV, dtype=torch.bfloat16, generator=torch.Generator(DEV).manual_seed(seed)
            )
            static.copy_(fresh)
            graph.replay()
            assert torch.equal(out, block(fresh))
