"""The block-FP8 kernels (ops/fp8/triton.py, ops/moe/triton_fp8.py) run by Triton's interpreter on the
CPU: their indexing, masks and scales against the dequantizing oracles. Needs `triton` (CI's CPU venv
skips this file); on a GPU test_fp8_triton.py covers the same and more.

Two limits of the interpreter shape this file: its bf16 dots are wrong, so the activations are fp32
(w8a16 then runs fp32 dots: exact to 1e-5), and its fp32 → e4m3 cast does not round to nearest even, so
the w8a8 GEMM is fed activations that quantize exactly (each 128-column group e4m3 values times a power
of two, with one ±448 setting the scale): any indexing or scale error then shows at 1e-5. The MoE's h
is rounded in the kernel, so its w8a8 check is the loose bound of that rounding."""

import os

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("the interpreter stands in for a GPU only where there is none", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first @triton.jit of our kernels
pytest.importorskip("triton")

from flashstate.ops.fp8 import naive as fp8_naive  # noqa: E402
from flashstate.ops.fp8 import triton as fp8_triton  # noqa: E402
from flashstate.ops.fp8.block_quant import FP8_DTYPE, quantize_block  # noqa: E402
from flashstate.ops.moe import Experts, naive, softmax_topk, triton_fp8  # noqa: E402
from flashstate.ops.moe.triton import Tiles  # noqa: E402


def _rel(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _exact_activations(m, k, g):
    """[m, k] fp32 whose per-row 128-groups quantize to e4m3 exactly: e4m3 values times 2^j, one of them
    ±448 per group (so the group's scale is 2^j)."""
    q = (torch.randn(m, k, generator=g) * 100).clamp(-440, 440).to(FP8_DTYPE).float()
    q[:, ::128] = 448.0 * torch.sign(torch.randn(m, len(range(0, k, 128)), generator=g))
    power = torch.randint(-12, -4, (m, (k + 127) // 128), generator=g).float().exp2()
    return q * power.repeat_interleave(128, dim=1)[:, :k]


@pytest.mark.parametrize(("m", "n", "k"), [(1, 256, 256), (7, 200, 300), (70, 130, 384), (3, 128, 100)])
def test_the_gemm_in_both_modes_matches_the_oracle(m, n, k):
    g = torch.Generator().manual_seed(m + n + k)
    wq, ws = quantize_block(torch.randn(n, k, generator=g) / k**0.5)
    x, bias = _exact_activations(m, k, g), torch.randn(n, generator=g)
    want = fp8_naive.fp8_linear(x.double(), wq, ws, bias.double())
    for a_fp8 in (False, True):
        tiles = fp8_triton.choose_tiles(m, n, a_fp8)
        for t in {tiles, tiles._replace(block_m=16, block_n=32)}:  # more tiles than rows / columns too
            got = fp8_triton.block_fp8_gemm(x, wq, ws, bias, a_fp8=a_fp8, tiles=t)
            assert got.dtype == torch.float32 and _rel(got, want) < 1e-5, (a_fp8, t)


def test_the_activation_quantizer_writes_scales_and_e4m3():
    g = torch.Generator().manual_seed(0)
    x = _exact_activations(9, 300, g)
    x[4] = 0
    q, s = fp8_triton.quantize_activation(x)
    assert q.dtype == FP8_DTYPE and s.shape == (9, 3)
    assert torch.equal(q.float() * s.repeat_interleave(128, dim=1)[:, :300], x)


def _case(t, e, k, d, i, gated, act, seed):
    g = torch.Generator().manual_seed(seed)
    x = _exact_activations(t, d, g)
    w_in = torch.randn(e, 2 * i if gated else i, d, generator=g) / d**0.5
    w_out = torch.randn(e, d, i, generator=g) / i**0.5
    (qi, si), (qo, so) = quantize_block(w_in), quantize_block(w_out)
    weights, ids = softmax_topk(torch.randn(t, e, generator=g), k, renormalize=True)
    return x, weights, ids, Experts(qi, qo, act, gated, w_in_scale=si, w_out_scale=so)


@pytest.mark.parametrize(
    ("t", "e", "k", "d", "i", "gated", "act"),
    [
        (5, 8, 2, 256, 128, True, "silu"),
        (9, 4, 2, 200, 72, True, "silu"),
        (6, 4, 3, 256, 200, False, "relu2"),
    ],
)
def test_the_fp8_experts_match_the_oracle(t, e, k, d, i, gated, act):
    x, weights, ids, ex = _case(t, e, k, d, i, gated, act, seed=t)
    want = naive.moe_experts(x.double(), weights.double(), ids, ex)
    narrow = Tiles(16, 32, 128, 4, 2)
    assert _rel(triton_fp8.moe_experts(x, weights, ids, ex, narrow, narrow, a_fp8=False), want) < 1e-5
    for up_n in (128, 64):  # h quantized in the up GEMM's epilogue, or by its own kernel
        tiles = Tiles(16, up_n, 128, 4, 2)
        got = triton_fp8.moe_experts(x, weights, ids, ex, tiles, tiles, a_fp8=True)
        assert _rel(got, want) < 0.1  # h's e4m3 rounding (the interpreter's: coarser than on a GPU)


def test_the_activation_quantizer_pads_rows_for_cublas():
    g = torch.Generator().manual_seed(1)
    x = _exact_activations(9, 300, g)
    q, s = fp8_triton.quantize_activation(x, cublas_layout=True)
    assert q.shape == (12, 300) and s.shape == (12, 3) and s.stride() == (1, 12)
    assert torch.equal(q[:9].float() * s[:9].repeat_interleave(128, dim=1)[:, :300], x)
    assert (q[9:].float() == 0).all()
