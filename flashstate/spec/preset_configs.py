"""Named model presets as HF `config.json` dicts (the table in models/presets.py, which writes the small
ones out with random weights). Plain data: the simulator reads a preset's geometry from here without torch
models.

The real-size presets (`DUMMY_ONLY`) are the released models' config.json values (the fields the parsers
read, plus the ones that name the model); they are built only on the device with random weights
(`--model NAME --load-format dummy`), never written to disk:

    preset                   released model (config.json values from)        params: total / active
    qwen3-next-80b-a3b       Qwen/Qwen3-Next-80B-A3B-Instruct-FP8 (FP8)       79.67B / 3.87B
    qwen3.6-35b-a3b          Qwen/Qwen3.6-35B-A3B (text model)                34.66B / 3.45B
    nemotron-3-nano-30b-a3b  nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16      31.58B / 3.58B
    kimi-linear-48b-a3b      moonshotai/Kimi-Linear-48B-A3B-Instruct          49.12B / 3.48B
    granite-4.0-h-tiny       ibm-granite/granite-4.0-h-tiny                   6.94B / 1.47B

Counts are `param_count.count_parameters` / `count_active_parameters` (embeddings and LM head included;
active: the top-k routed experts of each MoE layer, not all of them)."""

from __future__ import annotations

import copy
from typing import Any

from flashstate.default_tokenizer import DEFAULT_VOCAB_SIZE, ENDOFTEXT_ID, IM_END_ID

DEFAULT_PRESET = "tiny"
INIT_STD = 0.02  # HF's initializer_range for every preset; the random weights use it too
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
        "initializer_range": INIT_STD,
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
        "initializer_range": INIT_STD,
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
        "initializer_range": INIT_STD,
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


def _qwen3_6_35b_a3b() -> dict:
    """Qwen3.6-35B-A3B's config.json as released (Qwen3_5MoeForConditionalGeneration; the vision tower's
    config cut to what names it: flashstate serves the text model)."""
    text = {
        "model_type": "qwen3_5_moe_text",
        "vocab_size": 248320,
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(40)],
        "full_attention_interval": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "attn_output_gate": True,
        "attention_bias": False,
        "hidden_act": "silu",
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "max_position_embeddings": 262144,
        "mamba_ssm_dtype": "float32",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": 248044,
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 27, "hidden_size": 1152},
        "tie_word_embeddings": False,
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
    }


_NEMOTRON_3_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"


def _qwen3_next_fp8(num_layers: int, interval: int) -> dict:
    """The `quantization_config` of Qwen/Qwen3-Next-80B-A3B-Instruct-FP8: block-wise FP8, every linear but
    the LM head, the routers, the shared-expert gates and in_proj_ba (its norms, convs and gates are not
    linears; they are listed too, as there)."""
    skip = ["lm_head"]
    for i in range(num_layers):
        p = f"model.layers.{i}"
        if (i + 1) % interval:
            mixer = [f"{p}.linear_attn.{m}" for m in ("A_log", "conv1d", "dt_bias", "in_proj_ba", "norm")]
            skip += [f"{p}.input_layernorm", *mixer, f"{p}.mlp.gate", f"{p}.mlp.shared_expert_gate"]
            skip += [f"{p}.post_attention_layernorm"]
        else:
            skip += [f"{p}.input_layernorm", f"{p}.mlp.gate", f"{p}.mlp.shared_expert_gate"]
            skip += [f"{p}.post_attention_layernorm", f"{p}.self_attn.k_norm", f"{p}.self_attn.q_norm"]
    mtp = ["input_layernorm", "mlp.gate", "mlp.shared_expert_gate", "post_attention_layernorm"]
    skip += ["mtp.fc", *(f"mtp.layers.0.{m}" for m in (*mtp, "self_attn.k_norm", "self_attn.q_norm"))]
    skip += ["mtp.norm", "mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden"]
    return {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "modules_to_not_convert": skip, "weight_block_size": [128, 128],
    }  # fmt: skip

# Released models' configs: built on the device only (see the module docstring).
REAL_PRESETS: dict[str, dict] = {
    "qwen3-next-80b-a3b": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "full_attention_interval": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "attention_bias": False,
        "hidden_act": "silu",
        "intermediate_size": 5120,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10_000_000,
        "partial_rotary_factor": 0.25,
        "rope_scaling": None,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "quantization_config": _qwen3_next_fp8(48, 4),  # the FP8 release: 80B fits one H200 only so
    },
    "qwen3.6-35b-a3b": _qwen3_6_35b_a3b(),
    "nemotron-3-nano-30b-a3b": {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "vocab_size": 131072,
        "hidden_size": 2688,
        "num_hidden_layers": 52,
        "hybrid_override_pattern": _NEMOTRON_3_NANO_PATTERN,
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "attention_bias": False,
        "mamba_num_heads": 64,
        "mamba_head_dim": 64,
        "ssm_state_size": 128,
        "n_groups": 8,
        "expand": 2,
        "conv_kernel": 4,
        "chunk_size": 128,
        "use_conv_bias": True,
        "mamba_hidden_act": "silu",
        "mamba_proj_bias": False,
        "time_step_min": 0.001,
        "time_step_max": 0.1,
        "time_step_floor": 0.0001,
        "intermediate_size": 1856,
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
        "n_routed_experts": 128,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 1856,
        "moe_shared_expert_intermediate_size": 3712,
        "routed_scaling_factor": 2.5,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "layer_norm_epsilon": 1e-5,
        "rescale_prenorm_residual": True,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    },
    "kimi-linear-48b-a3b": {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "vocab_size": 163840,
        "hidden_size": 2304,
        "num_hidden_layers": 27,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "hidden_act": "silu",
        "intermediate_size": 9216,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "mla_use_nope": True,
        "linear_attn_config": {
            "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
            "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)],
            "num_heads": 32,
            "head_dim": 128,
            "short_conv_kernel_size": 4,
        },
        "num_experts": 256,
        "num_experts_per_token": 8,
        "num_shared_experts": 1,
        "moe_intermediate_size": 1024,
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": True,
        "routed_scaling_factor": 2.446,
        "use_grouped_topk": True,
        "num_expert_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_nextn_predict_layers": 0,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "model_max_length": 1048576,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "bos_token_id": 163584,
        "eos_token_id": 163586,
    },
}
REAL_PRESETS["granite-4.0-h-tiny"] = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "vocab_size": 100352,
    "hidden_size": 1536,
    "num_hidden_layers": 40,
    "layer_types": (["mamba"] * 5 + ["attention"] + ["mamba"] * 4) * 4,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "attention_bias": False,
    "attention_multiplier": 0.0078125,
    "position_embedding_type": "nope",
    "rope_theta": 10000,
    "rope_scaling": None,
    "hidden_act": "silu",
    "num_local_experts": 64,
    "num_experts_per_tok": 6,
    "intermediate_size": 512,
    "shared_intermediate_size": 1024,
    "mamba_n_heads": 48,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_n_groups": 1,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "embedding_multiplier": 12,
    "residual_multiplier": 0.22,
    "logits_scaling": 6,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "initializer_range": 0.1,
    "torch_dtype": "bfloat16",
    "bos_token_id": 100257,
    "eos_token_id": 100257,
    "pad_token_id": 100256,
}
PRESETS.update(REAL_PRESETS)
DUMMY_ONLY = frozenset(REAL_PRESETS)


def list_presets() -> list[str]:
    return list(PRESETS)


def preset_config(name: str) -> dict:
    """A fresh copy of preset `name`'s config.json dict."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])
