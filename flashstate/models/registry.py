"""Architecture name (`ModelSpec.architecture`: the model served) → model class."""

from __future__ import annotations

import importlib

import torch
from torch.overrides import TorchFunctionMode

from flashstate.models.base import HybridForCausalLM
from flashstate.spec.model_spec import ModelSpec, UnsupportedModelError

_CLASSES = {
    "Qwen3NextForCausalLM": "flashstate.models.qwen3_next:Qwen3NextForCausalLM",
    "NemotronHForCausalLM": "flashstate.models.nemotron_h:NemotronHForCausalLM",
    "KimiLinearForCausalLM": "flashstate.models.kimi_linear:KimiLinearForCausalLM",
    "Qwen3_5ForCausalLM": "flashstate.models.qwen3_5:Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM": "flashstate.models.qwen3_5:Qwen3_5ForCausalLM",
    "GraniteMoeHybridForCausalLM": "flashstate.models.granite_moe_hybrid:GraniteMoeHybridForCausalLM",
}


def model_class(spec: ModelSpec) -> type[HybridForCausalLM]:
    if spec.architecture not in _CLASSES:
        raise UnsupportedModelError(f"no model class for {spec.architecture}")
    module, name = _CLASSES[spec.architecture].split(":")
    return getattr(importlib.import_module(module), name)


def build_model(spec: ModelSpec) -> HybridForCausalLM:
    return model_class(spec)(spec)


class _NoInitOnMeta(TorchFunctionMode):
    """The in-place fills torch.nn.init's initialisers end in (normal_, uniform_, ...) do nothing to a meta
    tensor, which holds no values anyway. A torch function mode holds for its own thread only, so a model
    built on another thread meanwhile is initialised as usual."""

    FILLS = frozenset({"normal_", "uniform_", "erfinv_", "fill_", "zero_"})

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 — torch's hook
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes it by name
        if getattr(func, "__name__", None) in self.FILLS and getattr(target, "is_meta", False):
            return target
        return func(*args, **kwargs)


def build_meta_model(spec: ModelSpec) -> HybridForCausalLM:
    """The model's module tree on the meta device (shapes and dtypes, no memory), its initialisers skipped:
    on meta they run through torch's Python reference kernels, whose first call imports TorchDynamo (~3 s
    of every process's start-up, for values a meta tensor does not hold)."""
    with torch.device("meta"), _NoInitOnMeta():
        return build_model(spec)
