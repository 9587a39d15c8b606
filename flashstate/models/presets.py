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

import copy
import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from flashstate.default_tokenizer import (
    DEFAULT_VOCAB_SIZE,
    ENDOFTEXT_ID,
    IM_END_ID,
    build_default_tokenizer,
    write_default_tokenizer,
)
from flashstate.models.hf_config import spec_from_hf
from flashstate.models.registry import build_model
from flashstate.models.spec import ModelSpec

DEFAULT_PRESET = "tiny"
_FORMAT_VERSION = 1  # bump when materialize() writes different files for the same config and seed
_INIT_STD = 0.02
_SPECIAL_IDS = {"eos_token_id": IM_END_ID, "pad_token_id": ENDOFTEXT_ID, "bos_token_id": None}


def _qwen3_next(**kw: Any) -> dict:
    n = kw.pop("num_hidden_layers")
    cfg = {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "num_hidden_layers": n,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
        },
        "attention_bias": False,
        "linear_conv_kernel_dim": 4,
        "num_experts": 0,  # dense FFN in every layer
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 0,
        "shared_expert_intermediate_size": 0,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
        "initializer_range": _INIT_STD,
        **_SPECIAL_IDS,
    }
    return {**cfg, **kw}


def _nemotron_h(pattern: str, **kw: Any) -> dict:
    kinds = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    hf_types = {"mamba": "linear_attention", "attention": "full_attention", "mlp": "mlp", "moe": "moe"}
    cfg = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "layers_block_type": [hf_types[kinds[c]] for c in pattern],
        "mlp_hidden_act": "relu2",
        "mamba_hidden_act": "silu",
        "mlp_bias": False,
        "attention_bias": False,
        "use_conv_bias": True,
        "mamba_proj_bias": False,
        "conv_kernel": 4,
        "chunk_size": 128,
        "time_step_min": 0.001,
        "time_step_max": 0.1,
        "time_step_floor": 1e-4,
        "time_step_limit": [0.0, float("inf")],
        "layer_norm_epsilon": 1e-5,
        "n_routed_experts": 0,
        "n_shared_experts": 0,
        "tie_word_embeddings": False,
        "rescale_prenorm_residual": False,  # our init is plain normal(0, 0.02), see `init_tensor`
        "initializer_range": _INIT_STD,
        **_SPECIAL_IDS,
    }
    cfg.update(kw)
    cfg["expand"] = cfg["mamba_num_heads"] * cfg["mamba_head_dim"] // cfg["hidden_size"]  # must be an int
    return cfg


def _kimi_linear(**kw: Any) -> dict:
    n = kw.pop("num_hidden_layers")
    cfg = {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "num_hidden_layers": n,
        # Full (MLA) attention every 4th layer, as in the released checkpoints (1-indexed 4, 8, ...).
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
        "mlp_layer_types": ["dense"] * n,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "q_lora_rank": None,
        "attention_bias": False,
        "linear_conv_kernel_dim": 4,
        "num_experts": 0,
        "num_experts_per_token": 1,
        "num_shared_experts": 0,
        "moe_intermediate_size": 0,
        "moe_renormalize": True,
        "routed_scaling_factor": 1.0,
        "num_expert_group": 1,
        "topk_group": 1,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "initializer_range": _INIT_STD,
        **_SPECIAL_IDS,
    }
    cfg.update(kw)
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    cfg["max_position_embeddings"] = cfg["model_max_length"]  # HF writes model_max_length
    return cfg


_TINY = {"vocab_size": DEFAULT_VOCAB_SIZE, "hidden_size": 128, "dtype": "float32"}

PRESETS: dict[str, dict] = {
    # The same shapes as benchmarks/vllm_reference (the checkpoint real vLLM serves in the comparisons).
    "tiny": _qwen3_next(
        **_TINY,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        intermediate_size=384,
        max_position_embeddings=131072,
    ),
    "tiny-nemotron-h": _nemotron_h(
        "M-M-M*-M",
        **_TINY,
        mamba_num_heads=8,
        mamba_head_dim=32,
        n_groups=2,
        ssm_state_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=512,
        max_position_embeddings=131072,
    ),
    "tiny-kimi-linear": _kimi_linear(
        **_TINY,
        num_hidden_layers=8,
        linear_num_heads=4,
        linear_head_dim=32,
        num_attention_heads=4,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        intermediate_size=384,
        # Layer 0 dense, the rest MoE (the released model's layout): 8 experts, top-2, one shared expert.
        mlp_layer_types=["dense"] + ["sparse"] * 7,
        num_experts=8,
        num_experts_per_token=2,
        num_shared_experts=1,
        moe_intermediate_size=64,
        routed_scaling_factor=2.446,
        model_max_length=131072,
    ),
    "qwen3-next-2b": _qwen3_next(
        vocab_size=151936,
        hidden_size=2048,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        intermediate_size=5632,
        max_position_embeddings=262144,
        dtype="bfloat16",
    ),
    "nemotron-h-2b": _nemotron_h(
        "M-M-M-M-M*-" * 4,
        vocab_size=131072,
        hidden_size=2048,
        mamba_num_heads=64,
        mamba_head_dim=64,
        n_groups=8,
        ssm_state_size=128,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=8192,
        max_position_embeddings=262144,
        dtype="bfloat16",
    ),
    "kimi-linear-2b": _kimi_linear(
        vocab_size=163840,
        hidden_size=2048,
        num_hidden_layers=24,
        linear_num_heads=32,
        linear_head_dim=128,
        num_attention_heads=32,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        intermediate_size=5632,
        model_max_length=262144,
        dtype="bfloat16",
    ),
}


def list_presets() -> list[str]:
    return list(PRESETS)


def preset_config(name: str) -> dict:
    """A fresh copy of preset `name`'s config.json dict."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])


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
    return torch.randn(shape, generator=generator) * _INIT_STD


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
    home = os.environ.get("FLASHSTATE_HOME")
    return Path(home) if home else Path.home() / ".cache" / "flashstate"


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
