"""Architecture name (`ModelSpec.architecture`: the model served) → model class."""

from __future__ import annotations

import importlib

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
