"""Mixture-of-experts: routing (`softmax_topk`, `grouped_topk`, torch ops with no device wait) and the
routed experts' weighted sum (`moe_experts`: the fused Triton GEMMs on CUDA, bf16 or block-FP8 weights,
the per-expert oracle loop elsewhere). Shared experts and latent projections are dense and stay with the
models."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend
from flashstate.ops.moe.experts import Experts
from flashstate.ops.moe.routing import grouped_topk, softmax_topk

__all__ = ["Experts", "grouped_topk", "moe_experts", "softmax_topk"]


def moe_experts(x: Tensor, weights: Tensor, ids: Tensor, experts: Experts) -> Tensor:
    """x [T, D], routing weights and expert ids [T, k] → Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]), [T, D]
    in x's dtype. On CUDA no step waits on the device (CUDA-graph safe); the oracle reads the chosen
    experts on the host. FP8 experts (block scales set) take the FP8 kernels (triton_fp8.py)."""
    return backend("moe", "triton_fp8" if experts.fp8 else "triton", x).moe_experts(x, weights, ids, experts)
