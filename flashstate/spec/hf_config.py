"""HF config.json → ModelSpec (`spec_from_hf`), one parser per family: the only code that knows HF's config
names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from flashstate.spec.model_spec import (
    DTYPES,
    SUPPORTED_ARCHITECTURES,
    AttentionSpec,
    LayerSpec,
    LinearSpec,
    MlpSpec,
    ModelSpec,
    MoeSpec,
    UnsupportedModelError,
)


def _dtype(cfg: dict) -> torch.dtype:
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    if name not in DTYPES:
        raise UnsupportedModelError(f"unsupported dtype {name!r}")
    return DTYPES[name]


def _ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)


def _rope(cfg: dict) -> dict:
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rope.setdefault("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return rope


def _common(cfg: dict) -> dict:
    return dict(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=cfg.get("max_position_embeddings", 32768),
        dtype=_dtype(cfg),
        eos_token_ids=_ids(cfg.get("eos_token_id")),
        bos_token_id=cfg.get("bos_token_id"),
        pad_token_id=cfg.get("pad_token_id"),
    )


def _qwen3_next(cfg: dict) -> ModelSpec:
    """Absent keys take `Qwen3NextConfig`'s defaults (e.g. 512 experts, partial rotary 0.25)."""
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or [
        "linear_attention" if (i + 1) % cfg.get("full_attention_interval", 4) else "full_attention"
        for i in range(n)
    ]
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    step = cfg.get("decoder_sparse_step", 1)
    num_experts = cfg.get("num_experts", 512)

    def ffn(i: int) -> str:
        is_moe = i not in mlp_only and num_experts > 0 and step > 0 and (i + 1) % step == 0
        return "moe" if is_moe else "mlp"

    layers = tuple(
        LayerSpec("attention" if t == "full_attention" else "linear", ffn(i)) for i, t in enumerate(types)
    )
    rope = _rope({"partial_rotary_factor": 0.25, **cfg})
    if rope.get("rope_type", "default") != "default":
        raise UnsupportedModelError(f"Qwen3-Next rope_type {rope['rope_type']!r} is not supported")
    head_dim = cfg.get("head_dim") or 256
    nk, nv = cfg.get("linear_num_key_heads", 16), cfg.get("linear_num_value_heads", 32)
    dk, dv = cfg.get("linear_key_head_dim", 128), cfg.get("linear_value_head_dim", 128)
    if nv % nk:
        raise UnsupportedModelError(f"{nv} linear value heads are not a multiple of {nk} key heads")
    shared = cfg.get("shared_expert_intermediate_size", 512)
    return ModelSpec(
        architecture="Qwen3NextForCausalLM",
        layers=layers,
        attention=AttentionSpec(
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg.get("num_key_value_heads", 2),
            head_dim=head_dim,
            v_head_dim=head_dim,
            rotary_dim=int(head_dim * rope["partial_rotary_factor"]),
            rope_theta=float(rope["rope_theta"]),
            bias=bool(cfg.get("attention_bias", False)),
            output_gate=True,
            qk_norm=True,
        ),
        linear=LinearSpec(
            kind="gated_deltanet",
            num_heads=nv,
            num_k_heads=nk,
            head_k_dim=dk,
            head_v_dim=dv,
            conv_kernel=cfg.get("linear_conv_kernel_dim", 4),
            conv_channels=2 * nk * dk + nv * dv,
        ),
        mlp=MlpSpec(cfg.get("intermediate_size", 5632), cfg.get("hidden_act", "silu")),
        moe=MoeSpec(
            num_experts=num_experts,
            top_k=cfg.get("num_experts_per_tok", 10),
            intermediate_size=cfg.get("moe_intermediate_size", 512),
            shared_intermediate_size=shared,
            num_shared_experts=1,  # HF always builds the shared expert and its gate
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            act=cfg.get("hidden_act", "silu"),
            shared_expert_gate=True,
        )
        if any(layer.ffn == "moe" for layer in layers)
        else None,
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        **_common(cfg),
    )


_NEMOTRON_PATTERN = {"M": ("linear", None), "*": ("attention", None), "-": (None, "mlp"), "E": (None, "moe")}
_NEMOTRON_TYPES = {
    "mamba": ("linear", None),
    "linear_attention": ("linear", None),
    "attention": ("attention", None),
    "full_attention": ("attention", None),
    "mlp": (None, "mlp"),
    "moe": (None, "moe"),
}


def _nemotron_h(cfg: dict) -> ModelSpec:
    """Absent keys take `NemotronHConfig`'s defaults; config keys HF's modeling code ignores, we ignore."""
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if types is None:
        pattern = cfg.get("hybrid_override_pattern")
        if pattern is None:
            raise UnsupportedModelError("Nemotron-H config names no layer types (layers_block_type)")
        layers = tuple(LayerSpec(*_NEMOTRON_PATTERN[c]) for c in pattern)
    else:
        unknown = sorted(set(types) - set(_NEMOTRON_TYPES))
        if unknown:
            raise UnsupportedModelError(f"unknown Nemotron-H layer types {unknown}")
        layers = tuple(LayerSpec(*_NEMOTRON_TYPES[t]) for t in types)
    if (mamba_act := cfg.get("mamba_hidden_act", "silu")) != "silu":
        raise UnsupportedModelError(f"Nemotron-H mamba_hidden_act {mamba_act!r} is not supported")
    heads = cfg.get("mamba_num_heads", 128)
    head_dim = cfg.get("mamba_head_dim", 64)
    groups = cfg.get("n_groups", cfg.get("mamba_n_groups", 8))
    d_state = cfg.get("ssm_state_size", 128)
    inner = heads * head_dim  # HF ignores `expand`
    if heads % groups:
        raise UnsupportedModelError(f"mamba_num_heads {heads} is not a multiple of n_groups {groups}")
    head_attn = cfg.get("head_dim") or 128
    # HF's NemotronHMamba2Mixer clamps Δ to (time_step_min, inf) and ignores `time_step_limit`.
    dt_min = float(cfg.get("time_step_min", cfg.get("mamba_dt_min", 0.001)))
    act = cfg.get("mlp_hidden_act", "relu2")
    return ModelSpec(
        architecture="NemotronHForCausalLM",
        layers=layers,
        attention=AttentionSpec(
            num_heads=cfg.get("num_attention_heads", 32),
            num_kv_heads=cfg.get("num_key_value_heads") or cfg.get("num_attention_heads", 32),
            head_dim=head_attn,
            v_head_dim=head_attn,
            rotary_dim=0,  # no positional encoding in the attention layers
            rope_theta=0.0,
            bias=False,  # HF's NemotronHAttention has no biases whatever `attention_bias` says
        ),
        linear=LinearSpec(
            kind="mamba2",
            num_heads=heads,
            num_k_heads=heads,
            head_k_dim=d_state,
            head_v_dim=head_dim,
            conv_kernel=cfg.get("conv_kernel", cfg.get("mamba_d_conv", 4)),
            conv_channels=inner + 2 * groups * d_state,
            n_groups=groups,
            d_state=d_state,
            conv_bias=bool(cfg.get("use_conv_bias", cfg.get("mamba_conv_bias", True))),
            proj_bias=bool(cfg.get("use_bias", False)),  # HF's in_proj/out_proj read `use_bias`
            time_step_limit=(dt_min, float("inf")),
            chunk_size=cfg.get("chunk_size", cfg.get("mamba_chunk_size", 128)),
        ),
        mlp=MlpSpec(cfg.get("intermediate_size", 21504), act, bool(cfg.get("mlp_bias", False))),
        moe=MoeSpec(
            num_experts=cfg.get("n_routed_experts", 8),
            top_k=cfg.get("num_experts_per_tok", 2),
            intermediate_size=cfg.get("moe_intermediate_size", 7688),
            # HF always builds the (single) shared expert, whatever `n_shared_experts` says.
            shared_intermediate_size=cfg.get("moe_shared_expert_intermediate_size", 7688),
            num_shared_experts=1,
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            act=act,
            scoring="sigmoid",
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
            n_group=cfg.get("n_group", 1),
            topk_group=cfg.get("topk_group", 1),
            correction_bias=True,
            latent_size=cfg.get("moe_latent_size"),
        )
        if any(layer.ffn == "moe" for layer in layers)
        else None,
        norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
        # HF's NemotronHForCausalLM never ties lm_head to the embeddings, whatever the config says.
        **(_common(cfg) | {"tie_word_embeddings": False}),
    )


def _kimi_linear(cfg: dict) -> ModelSpec:
    """Absent keys take `KimiLinearConfig`'s defaults; both HF's saved names and Moonshot's checkpoint
    names (`linear_attn_config`, `first_k_dense_replace`) are read."""
    n = cfg.get("num_hidden_layers", 27)
    lin = cfg.get("linear_attn_config") or {}
    types = cfg.get("layer_types")
    if types is None:
        if "full_attn_layers" in lin and "kda_layers" in lin:
            types = [None] * n
            for i in lin["full_attn_layers"]:  # 1-indexed in checkpoints
                types[i - 1] = "full_attention"
            for i in lin["kda_layers"]:
                types[i - 1] = "linear_attention"
        else:
            types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    mlp_types = cfg.get("mlp_layer_types") or [
        "dense" if i < cfg.get("first_k_dense_replace", 1) else "sparse" for i in range(n)
    ]
    layers = tuple(
        LayerSpec(
            "attention" if t == "full_attention" else "linear", "moe" if m == "sparse" else "mlp"
        )
        for t, m in zip(types, mlp_types, strict=True)
    )
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"Kimi-Linear hidden_act {cfg['hidden_act']!r} is not supported")
    heads = lin.get("num_heads", cfg.get("linear_num_heads", 32))
    hd = lin.get("head_dim", cfg.get("linear_head_dim", 128))
    nope, rope_dim = cfg.get("qk_nope_head_dim", 128), cfg.get("qk_rope_head_dim", 64)
    num_experts = cfg.get("num_experts", cfg.get("num_local_experts", 256))
    num_shared = cfg.get("num_shared_experts", cfg.get("n_shared_experts", 1))
    moe_inter = cfg.get("moe_intermediate_size", 1024)
    attn_heads = cfg.get("num_attention_heads", 32)
    common = _common(cfg) | {
        "max_position_embeddings": cfg.get("model_max_length", cfg.get("max_position_embeddings", 1048576)),
        # HF's KimiLinearForCausalLM never ties lm_head to the embeddings, whatever the config says.
        "tie_word_embeddings": False,
    }
    return ModelSpec(
        architecture="KimiLinearForCausalLM",
        layers=layers,
        attention=AttentionSpec(
            num_heads=attn_heads,
            num_kv_heads=attn_heads,  # MLA: K/V are decompressed per query head
            head_dim=nope + rope_dim,
            v_head_dim=cfg.get("v_head_dim") or 128,
            rotary_dim=0,  # NoPE: HF and Moonshot apply no rotary to the qk_rope part
            rope_theta=float(_rope(cfg)["rope_theta"]),
            bias=bool(cfg.get("attention_bias", False)),
            kv_lora_rank=cfg.get("kv_lora_rank", 512),
            q_lora_rank=cfg.get("q_lora_rank"),
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope_dim,
        ),
        linear=LinearSpec(
            kind="kda",
            num_heads=heads,
            num_k_heads=heads,
            head_k_dim=hd,
            head_v_dim=hd,
            conv_kernel=lin.get("short_conv_kernel_size", cfg.get("linear_conv_kernel_dim", 4)),
            conv_channels=3 * heads * hd,
        ),
        mlp=MlpSpec(cfg.get("intermediate_size", 9216), cfg.get("hidden_act", "silu")),
        moe=MoeSpec(
            num_experts=num_experts,
            top_k=cfg.get("num_experts_per_token", cfg.get("num_experts_per_tok", 8)),
            intermediate_size=moe_inter,
            shared_intermediate_size=moe_inter * num_shared,
            num_shared_experts=num_shared,
            norm_topk_prob=bool(cfg.get("moe_renormalize", cfg.get("norm_topk_prob", True))),
            act=cfg.get("hidden_act", "silu"),
            scoring="sigmoid",
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 2.446)),
            n_group=cfg.get("num_expert_group", cfg.get("n_group", 1)),
            topk_group=cfg.get("topk_group", 1),
            correction_bias=True,
        )
        if any(layer.ffn == "moe" for layer in layers)
        else None,
        norm_eps=cfg.get("rms_norm_eps", 1e-5),
        **common,
    )


PARSERS = {
    "Qwen3NextForCausalLM": _qwen3_next,
    "NemotronHForCausalLM": _nemotron_h,
    "KimiLinearForCausalLM": _kimi_linear,
}


def spec_from_hf(config: dict[str, Any] | str | Path) -> ModelSpec:
    """The ModelSpec of an HF `config.json` (a path, a directory holding one, or the parsed dict)."""
    if not isinstance(config, dict):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {path}")
        config = json.loads(path.read_text())
    archs = config.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise UnsupportedModelError(
            f"unsupported architecture {archs or config.get('model_type')!r}; "
            f"flashstate supports {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return PARSERS[arch](config)
