"""Architecture name (`ModelSpec.architecture`: the model served) → model class."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import torch

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


# torch.nn.init's in-place initialisers: what nn.Linear / nn.Embedding call from reset_parameters
_INITIALISERS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                 "xavier_uniform_", "xavier_normal_", "constant_", "ones_", "zeros_")  # fmt: skip


@contextlib.contextmanager
def _initialisers_skipped() -> Iterator[None]:
    saved = {name: getattr(torch.nn.init, name) for name in _INITIALISERS}
    try:
        for name in _INITIALISERS:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def build_meta_model(spec: ModelSpec) -> HybridForCausalLM:
    """The model's module tree on the meta device (shapes and dtypes, no memory), its initialisers skipped:
    on meta they run through torch's Python reference kernels, whose first call imports TorchDynamo (~3 s
    of every process's start-up, for values a meta tensor does not hold)."""
    with torch.device("meta"), _initialisers_skipped():
        return build_model(spec)
