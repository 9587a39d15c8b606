"""Named model presets: HF `config.json` dicts, and random-weight model directories made from them.

    preset            family       dtype  layout                                params: total / w/o embeddings
    tiny              Qwen3-Next   fp32   4 layers, attention at 3, dense       1.38M / 0.86M   (the default)
    tiny-nemotron-h   Nemotron-H   fp32   "M-M-M*-M": 4 Mamba2, 1 attn, 3 MLP   1.44M / 0.92M
    tiny-kimi-linear  Kimi-Linear  fp32   8 layers, MLA at 3, 7, MoE 8 × top-2  2.87M / 2.35M
    qwen3-next-2b     Qwen3-Next   bf16   24 layers, 6 attention, dense         2.223B / 1.601B
    nemotron-h-2b     Nemotron-H   bf16   "M-M-M-M-M*-" × 4 (44 blocks)         1.841B / 1.304B
    kimi-linear-2b    Kimi-Linear  bf16   24 layers, 6 MLA, dense               2.294B / 1.623B

The real-size presets are the released models' configs (spec/preset_configs.py names the source of
each); they are built only on the device with random weights (`--model NAME --load-format dummy`):
`materialize` and `preset_dir` refuse them, and `materialize_config` any config over 4B parameters.

    preset                   family       layout                                   params: total / active
    qwen3-next-80b-a3b       Qwen3-Next   48 layers, 12 attention, MoE 512 × top-10  79.67B / 3.87B
    qwen3.6-35b-a3b          Qwen3.5-MoE  40 layers, 10 attention, MoE 256 × top-8   34.66B / 3.45B
    nemotron-3-nano-30b-a3b  Nemotron-H   52 blocks: 23 Mamba2, 6 attn, 23 MoE 128×6 31.58B / 3.58B
    kimi-linear-48b-a3b      Kimi-Linear  27 layers, 7 MLA, MoE 256 × top-8          49.12B / 3.48B
    granite-4.0-h-tiny       Granite-4.0-H 40 layers, 4 attn (NoPE), MoE 64 × top-6    6.94B / 1.47B

(active: `param_count.count_active_parameters`, embeddings included: the top-k routed experts of each
MoE layer instead of all.)

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
from flashstate.models.param_count import count_parameters
from flashstate.models.random_init import random_tensors
from flashstate.models.registry import build_meta_model
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.model_spec import ModelSpec
from flashstate.spec.preset_configs import DEFAULT_PRESET, DUMMY_ONLY, preset_config

_FORMAT_VERSION = 1  # bump when materialize() writes different files for the same config and seed
MAX_WRITTEN_PARAMETERS = 4_000_000_000  # larger random models are only built on the device (dummy load)


def random_weights(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """A deterministic random checkpoint for `spec`: {HF tensor name: tensor in `spec.dtype`}, the draws
    of `random_init.random_tensors` on the CPU (`--load-format dummy` on the CPU fills a model with the
    same values). The LM head is left out when the embeddings are tied."""
    state = {name: t.to(spec.dtype) for name, t in random_tensors(spec, seed)}
    if spec.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def materialize(name: str, directory: str | Path, seed: int = 0) -> Path:
    """Write preset `name` as an HF model directory: config.json, tokenizer.json + tokenizer_config.json
    (the default tokenizer), model.safetensors (random weights from `seed`)."""
    _refuse_dummy_only(name)
    return materialize_config(preset_config(name), directory, seed)


def materialize_config(config: dict, directory: str | Path, seed: int = 0) -> Path:
    """`materialize` for any supported config dict of at most `MAX_WRITTEN_PARAMETERS` parameters."""
    spec = spec_from_hf(config)
    if (n := count_parameters(spec)) > MAX_WRITTEN_PARAMETERS:
        raise ValueError(
            f"refusing to write a {n / 1e9:.1f}B-parameter random checkpoint "
            f"({n * spec.dtype.itemsize / 1e9:.0f} GB); build it on the device instead: --load-format dummy"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = random_weights(spec, seed)
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
    _refuse_dummy_only(name)
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


def _refuse_dummy_only(name: str) -> None:
    if name in DUMMY_ONLY:
        raise ValueError(
            f"preset {name!r} is a real-size model, built only on the device with random weights "
            f"(--model {name} --load-format dummy); it is never written to disk"
        )


def _fingerprint(config: dict, seed: int) -> str:
    model = build_meta_model(spec_from_hf(config))
    layout = sorted((k, list(v.shape)) for k, v in model.state_dict().items())
    tokenizer = hashlib.sha256(build_default_tokenizer().to_str().encode()).hexdigest()
    key = json.dumps([_FORMAT_VERSION, config, seed, layout, tokenizer], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]
