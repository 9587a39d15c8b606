"""Random weights initialised like HF, filled into a built model in place: the weights of the preset
checkpoints (models/presets.py writes them) and of `--load-format dummy` (models/loader.py, on the device).

Every tensor of the full model's state_dict is drawn in sorted-name order from one generator seeded with
`seed`, in fp32, in the checkpoint's layout; then, like a checkpoint tensor at load, it is cut to this
rank's share (tensor parallelism) and put in the layout its parameter holds (`from_checkpoint`). So a
model's weights depend only on the config, the seed and the generator's device type: the CPU draws equal
the preset checkpoints', and every rank of a split holds its share of the same model. A block-FP8 model's
linear weights are those draws block-quantized (`quantize_block`) one tensor at a time, so the model is
never held in full precision.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from flashstate.models.base import HybridForCausalLM
from flashstate.models.registry import build_meta_model
from flashstate.models.shard_plan import ShardPlan
from flashstate.ops.fp8.block_quant import FP8_DTYPE, quantize_block
from flashstate.spec.model_spec import ModelSpec
from flashstate.spec.preset_configs import INIT_STD

# Qwen3-Next-style RMSNorms are zero-centred (`x̂ · (1 + w)`, initialised to 0), but for the Gated
# DeltaNet output norm.
_ZERO_CENTRED_NORMS = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")


def init_tensor(
    spec: ModelSpec,
    name: str,
    shape: tuple[int, ...],
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> Tensor:
    """HF's initialisation of checkpoint tensor `name`, in fp32 on `device` (the generator's):

    A_log           log A: Mamba2 A = 1..H; KDA A ~ U(1, 16); Gated DeltaNet A ~ U(0.01, 16)
    dt_bias         Gated DeltaNet 1; Mamba2 / KDA softplus⁻¹(dt), log dt ~ U(log 1e-3, log 1e-1)
    D               1 (Mamba2 skip)
    *bias           0 (router correction biases included)
    *norm*.weight   1, or 0 for the zero-centred RMSNorms of Qwen3-Next and Qwen3.5 (`x̂ · (1 + w)`: all
                    their norms but the Gated DeltaNet output norm)
    anything else   normal(0, 0.02) (every preset's `initializer_range`)
    """
    parts = name.split(".")
    leaf, module = parts[-1], parts[-2] if len(parts) > 1 else ""
    kind = spec.linear.kind if spec.linear is not None else None

    def uniform(lo: float, hi: float) -> Tensor:
        return torch.rand(shape, generator=generator, device=device) * (hi - lo) + lo

    if leaf == "A_log":
        if kind == "mamba2":
            return (
                torch.arange(1, math.prod(shape) + 1, dtype=torch.float32, device=device).reshape(shape).log()
            )
        return uniform(1.0, 16.0).log() if kind == "kda" else uniform(0.01, 16.0).log()
    if leaf == "dt_bias":
        if kind == "gated_deltanet":
            return torch.ones(shape, device=device)
        dt = uniform(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
        return dt + torch.log(-torch.expm1(-dt))
    if leaf == "D":
        return torch.ones(shape, device=device)
    if leaf.endswith("bias"):
        return torch.zeros(shape, device=device)
    if "norm" in module and leaf == "weight":
        zero_centred = spec.architecture in _ZERO_CENTRED_NORMS and not name.endswith(
            "linear_attn.norm.weight"
        )
        return torch.zeros(shape, device=device) if zero_centred else torch.ones(shape, device=device)
    return torch.randn(shape, generator=generator, device=device) * INIT_STD


def random_tensors(
    spec: ModelSpec, seed: int = 0, device: torch.device | str = "cpu"
) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) for every tensor of `build_model(spec).state_dict()`, in sorted-name order, in the
    checkpoint's layout, fp32 (integer buffers: zeros of their dtype); drawn on `device`."""
    state = build_meta_model(spec).state_dict()
    generator = torch.Generator(device=device).manual_seed(seed)
    for name in sorted(state):
        meta = state[name]
        if meta.is_floating_point():
            yield name, init_tensor(spec, name, tuple(meta.shape), generator, device)
        else:
            yield name, torch.zeros(meta.shape, dtype=meta.dtype, device=device)


@torch.no_grad()
def randomize_(
    model: HybridForCausalLM, seed: int = 0, full_spec: ModelSpec | None = None, plan: ShardPlan | None = None
) -> HybridForCausalLM:
    """Fill every tensor of `model` (built, on its device) with `random_tensors`, each put where a
    checkpoint tensor of that name would go. With tensor parallelism `model` is one rank's share:
    `full_spec` is the whole model's spec and `plan` this rank's slicing. Returns `model`."""
    state = model.state_dict()
    device = next(iter(state.values())).device
    for name, tensor in random_tensors(full_spec or model.spec, seed, device):
        if plan is not None:
            tensor = plan.slice(name, tensor)
        if state[name].dtype == FP8_DTYPE:  # an FP8 linear: weight and scales as a checkpoint stores them
            tensor, scale = quantize_block(tensor)
            scale_name = name.removesuffix("weight") + "weight_scale_inv"
            state[scale_name].copy_(model.from_checkpoint(scale_name, scale))
        state[name].copy_(model.from_checkpoint(name, tensor))
    return model
