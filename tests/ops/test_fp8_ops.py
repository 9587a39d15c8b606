"""Block-FP8 ops on the CPU: `fp8_linear` and FP8 `Experts` take the dequantizing oracles (exactly the
bf16 / fp32 ops over the dequantized weights), and FP8 expert stacks are validated on construction."""

import pytest
import torch
import torch.nn.functional as F

from flashstate.ops.fp8 import cublas, fp8_linear
from flashstate.ops.fp8.block_quant import dequantize_block, quantize_block
from flashstate.ops.moe import Experts, moe_experts, softmax_topk


def _fp8_experts(e, d, i, gated, act="silu", seed=0):
    g = torch.Generator().manual_seed(seed)
    w_in = torch.randn(e, 2 * i if gated else i, d, generator=g) / d**0.5
    w_out = torch.randn(e, d, i, generator=g) / i**0.5
    (qi, si), (qo, so) = quantize_block(w_in), quantize_block(w_out)
    return Experts(qi, qo, act, gated, w_in_scale=si, w_out_scale=so)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_on_the_cpu_is_the_linear_of_the_dequantized_weight(dtype):
    wq, ws = quantize_block(torch.randn(200, 300) / 300**0.5)
    x, bias = torch.randn(3, 5, 300).to(dtype), torch.randn(200).to(dtype)
    got = fp8_linear(x, wq, ws, bias)
    assert got.dtype == dtype and got.shape == (3, 5, 200)
    assert torch.equal(got, F.linear(x, dequantize_block(wq, ws, dtype), bias))


@pytest.mark.parametrize(
    ("gated", "act", "i"), [(True, "silu", 72), (False, "relu2", 200), (True, "silu", 128)]
)
def test_fp8_experts_on_the_cpu_are_the_dequantized_experts(gated, act, i):
    t, e, k, d = 11, 6, 2, 160
    ex = _fp8_experts(e, d, i, gated, act)
    plain = Experts(dequantize_block(ex.w_in, ex.w_in_scale, torch.float32),
                    dequantize_block(ex.w_out, ex.w_out_scale, torch.float32), act, gated)  # fmt: skip
    assert ex.fp8 and not plain.fp8
    x = torch.randn(t, d)
    weights, ids = softmax_topk(torch.randn(t, e), k, renormalize=True)
    assert torch.equal(moe_experts(x, weights, ids, ex), moe_experts(x, weights, ids, plain))


def test_fp8_expert_stacks_are_validated():
    ex = _fp8_experts(4, 256, 128, gated=True)
    assert ex.w_in_scale.shape == (4, 2, 2) and ex.w_out_scale.shape == (4, 2, 1)
    with pytest.raises(ValueError, match="both"):
        Experts(ex.w_in, ex.w_out, "silu", True, w_in_scale=ex.w_in_scale)
    with pytest.raises(ValueError, match="w_out_scale must be float32"):
        Experts(ex.w_in, ex.w_out, "silu", True, w_in_scale=ex.w_in_scale, w_out_scale=ex.w_out_scale[:, :1])
    with pytest.raises(ValueError, match="w_in must be float8_e4m3fn"):
        Experts(ex.w_in.float(), ex.w_out, "silu", True, w_in_scale=ex.w_in_scale, w_out_scale=ex.w_out_scale)
    with pytest.raises(ValueError, match="w_in_scale must be float32"):
        Experts(
            ex.w_in, ex.w_out, "silu", True, w_in_scale=ex.w_in_scale.double(), w_out_scale=ex.w_out_scale
        )


def test_cublas_weight_scales_pad_k_blocks_to_four_and_go_k_block_major():
    s = torch.arange(6.0).view(2, 3)  # N/128 = 2 row blocks, K/128 = 3 column blocks
    got = cublas.weight_scales(s)
    assert got.shape == (4, 2) and got.stride() == (1, 4)
    assert torch.equal(got[:3], s.t()) and (got[3] == 0).all()
    whole = torch.rand(3, 8)  # K/128 already a multiple of 4: a view, no copy
    assert cublas.weight_scales(whole).data_ptr() == whole.data_ptr()
    assert torch.equal(cublas.weight_scales(whole), whole.t())


def test_cublas_takes_only_large_bf16_gemms_of_whole_blocks_on_a_gpu():
    gpu = torch.device("cuda", 0)
    # each refusal is decided from the shapes alone, before any CUDA query
    assert not cublas.usable(128, 2048, 4096, torch.bfloat16, gpu)  # M·N·K = 2^30: the Triton GEMM's
    assert not cublas.usable(8192, 2048, 2000, torch.bfloat16, gpu)
    assert not cublas.usable(8192, 200, 2048, torch.bfloat16, gpu)
    assert not cublas.usable(8192, 2048, 2048, torch.float32, gpu)
    assert not cublas.usable(8192, 2048, 2048, torch.bfloat16, torch.device("cpu"))
