"""Named model presets: HF `config.json` dicts, and random-weight model directories made from them.

    preset            family       dtype  layout                                params: total / w/o embeddings
    tiny              Qwen3-Next   fp32   4 layers, attention at 3, dense       1.38M / 0.86M   (the default)
    tiny-nemotron-h   Nemotron-H   fp32   "M-M-M*-M": 4 Mamba2, 1 attn, 3 MLP   1.44M / 0.92M
    tiny-kimi-linear  Kimi-Linear  fp32   8 layers, MLA at 3, 7, MoE 8 × top-2  2.87M / 2.35M
    qwen3-next-2b     Qwen3-Next   bf16   24 layers, 6 attention, dense         2.223B / 1.601B
    nemotron-h-2b     Nemotron-H   bf16   "M-M-M-M-M*-" × 4 (44 blocks)         1.841B / 1.304B
    kimi-linear-2b    Kimi-Linear  bf16   24 layers, 6 MLA, dense               2.294B / 1.623B

The tiny presets use the default tokenizer's vocabulary (2048) and are fast on a CPU. The 2B presets keep
each family's real mixer shapes (Qwen3-Next-80B's attention and Gated DeltaNet heads at hidden 2048,
Nemotron-H's Mamba2 heads/groups/state and attention, Kimi-Linear's KDA heads and MLA ranks) and real
vocabulary sizes, with a dense FFN (no MoE) so prefill is GEMM-bound; they are for GPU benchmarks.
`param_count.count_parameters(spec)` computes the counts above from the spec, in HF's parameterisation.

`materialize(name, dir)` writes config.json, the default tokenizer and random weights
(`model.safetensors`, HF tensor names); `default_model_dir()` does it once into a cache directory.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from flashstate import envs
from flashstate.default_tokenizer import (
    build_default_tokenizer,
    write_default_tokenizer,
)
from flashstate.models.registry import build_model
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.model_spec import ModelSpec
from flashstate.spec.preset_configs import DEFAULT_PRESET, INIT_STD, preset_config

_FORMAT_VERSION = 1  # bump when materialize() writes different files for the same config and seed


def random_weights(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """A deterministic random checkpoint for `spec`: {HF tensor name: tensor in `spec.dtype`}.

    Every tensor of `build_model(spec).state_dict()` is drawn in sorted-name order from one generator
    seeded with `seed` (see `init_tensor`); a model class may then adjust them in its own
    `init_weights(generator)`. The LM head is left out when the embeddings are tied.
    """
    with torch.device("meta"):
        model = build_model(spec)
    model = model.to_empty(device="cpu").to(spec.dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        state = model.state_dict()
        for name in sorted(state):
            tensor = state[name]
            if tensor.is_floating_point():
                tensor.copy_(init_tensor(spec, name, tuple(tensor.shape), generator))
            else:
                tensor.zero_()
        hook = getattr(model, "init_weights", None)
        if callable(hook):
            hook(generator)
    state = model.state_dict()
    if spec.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    # a stacked projection's weights are row views of one tensor (layers/stacked_linear.py): own copies
    return {
        name: t.clone() if t.untyped_storage().nbytes() != t.nbytes else t.contiguous()
        for name, t in state.items()
    }


def init_tensor(
    spec: ModelSpec, name: str, shape: tuple[int, ...], generator: torch.Generator
) -> torch.Tensor:
    """HF's initialisation of checkpoint tensor `name`, in fp32:

    A_log           log A: Mamba2 A = 1..H; KDA A ~ U(1, 16); Gated DeltaNet A ~ U(0.01, 16)
    dt_bias         Gated DeltaNet 1; Mamba2 / KDA softplus⁻¹(dt), log dt ~ U(log 1e-3, log 1e-1)
    D               1 (Mamba2 skip)
    *bias           0 (router correction biases included)
    *norm*.weight   1, or 0 for Qwen3-Next's zero-centred RMSNorms (`x̂ · (1 + w)`: all its norms
                    but the Gated DeltaNet output norm)
    anything else   normal(0, 0.02) (every preset's `initializer_range`)
    """
    parts = name.split(".")
    leaf, module = parts[-1], parts[-2] if len(parts) > 1 else ""
    kind = spec.linear.kind if spec.linear is not None else None

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return torch.rand(shape, generator=generator) * (hi - lo) + lo

    if leaf == "A_log":
        if kind == "mamba2":
            return torch.arange(1, math.prod(shape) + 1, dtype=torch.float32).reshape(shape).log()
        return uniform(1.0, 16.0).log() if kind == "kda" else uniform(0.01, 16.0).log()
    if leaf == "dt_bias":
        if kind == "gated_deltanet":
            return torch.ones(shape)
        dt = uniform(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
        return dt + torch.log(-torch.expm1(-dt))
    if leaf == "D":
        return torch.ones(shape)
    if leaf.endswith("bias"):
        return torch.zeros(shape)
    if "norm" in module and leaf == "weight":
        zero_centred = spec.architecture == "Qwen3NextForCausalLM" and not name.endswith(
            "linear_attn.norm.weight"
        )
        return torch.zeros(shape) if zero_centred else torch.ones(shape)
    return torch.randn(shape, generator=generator) * INIT_STD


def materialize(name: str, directory: str | Path, seed: int = 0) -> Path:
    """Write preset `name` as an HF model directory: config.json, tokenizer.json + tokenizer_config.json
    (the default tokenizer), model.safetensors (random weights from `seed`)."""
    return materialize_config(preset_config(name), directory, seed)


def materialize_config(config: dict, directory: str | Path, seed: int = 0) -> Path:
    """`materialize` for any supported config dict."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = random_weights(spec_from_hf(config), seed)
    write_default_tokenizer(directory)
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def cache_root() -> Path:
    """`$FLASHSTATE_HOME`, else `~/.cache/flashstate`."""
    return envs.FLASHSTATE_HOME


def preset_dir(name: str = DEFAULT_PRESET, seed: int = 0) -> Path:
    """Preset `name` materialised once under `cache_root()/models/<name>-<fingerprint>` and reused.

    The fingerprint covers the config, the seed, the default tokenizer and the model's tensor names and
    shapes, so a change to any of them makes a new directory. The directory is written under a temporary
    name and renamed into place: a reader sees a complete model or none, and of two concurrent writers
    the second to finish drops its copy.
    """
    config = preset_config(name)
    final = cache_root() / "models" / f"{name}-{_fingerprint(config, seed)}"
    if (final / "model.safetensors").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        materialize_config(config, tmp, seed)
        for file in tmp.iterdir():  # safetensors writes 0600 and mkdtemp makes 0700: let others read
            file.chmod(0o644)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def default_model_dir() -> Path:
    """The embedded default model (`tiny`, seed 0), materialised on first use."""
    return preset_dir(DEFAULT_PRESET)


def _fingerprint(config: dict, seed: int) -> str:
    with torch.device("meta"):
        model = build_model(spec_from_hf(config))
    layout = sorted((k, list(v.shape)) for k, v in model.state_dict().items())
    tokenizer = hashlib.sha256(build_default_tokenizer().to_str().encode()).hexdigest()
    key = json.dumps([_FORMAT_VERSION, config, seed, layout, tokenizer], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]
