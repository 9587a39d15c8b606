"""HF config.json → ModelSpec (`spec_from_hf`), one parser per family: the only code that knows HF's config
names."""

from __future__ import annotations

import json
from functools import partial
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


def _check_family(cfg: dict, architecture: str, model_types: tuple[str, ...], keys: tuple) -> None:
    """Refuse a config that is not `architecture`'s: another family's `model_type`, a nested `text_config`
    where the family has none, or a missing field the family cannot do without (a key, or a tuple of
    alternative keys). Without this, a config renamed to another family would parse with that family's
    defaults (a dense Qwen3.5 config read as Qwen3-Next gets 512 experts)."""
    model_type = cfg.get("model_type")
    if model_type is not None and model_type not in model_types:
        raise UnsupportedModelError(
            f"config.json names architecture {architecture} but its model_type is {model_type!r} "
            f"(expected {' or '.join(map(repr, model_types))}): refusing to read it as {architecture}"
        )
    if "text_config" in cfg:
        raise UnsupportedModelError(
            f"config.json names architecture {architecture} but nests a text_config, which {architecture} "
            "configs never do: refusing to read it"
        )
    missing = [
        " or ".join(k) if isinstance(k, tuple) else k
        for k in keys
        if not (any(a in cfg for a in k) if isinstance(k, tuple) else k in cfg)
    ]
    if missing:
        raise UnsupportedModelError(
            f"config.json names architecture {architecture} but lacks {', '.join(missing)}: "
            f"not a complete {architecture} config"
        )


_GDN_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "linear_num_key_heads",
    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
)  # fmt: skip
_QWEN_MOE_KEYS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)


def _gdn_hybrid(cfg: dict, architecture: str, moe_layers: list[bool], norm_topk_prob: bool) -> ModelSpec:
    """The Qwen3-Next layout (Qwen3.5 / 3.6 share it): Gated DeltaNet and gated full-attention layers, each
    followed by an MoE (`moe_layers[i]`) or a dense SwiGLU MLP. Absent keys take `Qwen3NextConfig`'s
    defaults (e.g. partial rotary 0.25)."""
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or [
        "linear_attention" if (i + 1) % cfg.get("full_attention_interval", 4) else "full_attention"
        for i in range(n)
    ]
    if len(types) != n or set(types) - {"linear_attention", "full_attention"}:
        raise UnsupportedModelError(f"{architecture} layer_types must be {n} linear/full_attention entries")
    layers = tuple(
        LayerSpec("attention" if t == "full_attention" else "linear", "moe" if moe else "mlp")
        for t, moe in zip(types, moe_layers, strict=True)
    )
    rope = _rope({"partial_rotary_factor": 0.25, **cfg})
    if rope.get("rope_type", "default") != "default":
        raise UnsupportedModelError(f"{architecture} rope_type {rope['rope_type']!r} is not supported")
    head_dim = cfg.get("head_dim") or 256
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if nv % nk:
        raise UnsupportedModelError(f"{nv} linear value heads are not a multiple of {nk} key heads")
    return ModelSpec(
        architecture=architecture,
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
            num_experts=cfg["num_experts"],
            top_k=cfg.get("num_experts_per_tok", 10),
            intermediate_size=cfg.get("moe_intermediate_size", 512),
            shared_intermediate_size=cfg.get("shared_expert_intermediate_size", 512),
            num_shared_experts=1,  # HF always builds the shared expert and its gate
            norm_topk_prob=norm_topk_prob,
            act=cfg.get("hidden_act", "silu"),
            shared_expert_gate=True,
        )
        if any(moe_layers)
        else None,
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        **_common(cfg),
    )


def _qwen3_next(cfg: dict) -> ModelSpec:
    arch = "Qwen3NextForCausalLM"
    # Its sparse-layer schedule is what tells a Qwen3-Next config from a Qwen3.5-MoE one without model_type.
    schedule = ("decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "intermediate_size")
    _check_family(cfg, arch, ("qwen3_next",), (*_GDN_KEYS, "num_experts", *schedule))
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    step, num_experts = cfg.get("decoder_sparse_step", 1), cfg["num_experts"]
    moe = [
        i not in mlp_only and num_experts > 0 and step > 0 and (i + 1) % step == 0
        for i in range(cfg["num_hidden_layers"])
    ]
    return _gdn_hybrid(cfg, arch, moe, norm_topk_prob=bool(cfg.get("norm_topk_prob", True)))


# config.json architecture → (the text model served, MoE, outer model_type or None, text model_type)
_QWEN3_5 = {
    "Qwen3_5ForCausalLM": ("Qwen3_5ForCausalLM", False, None, "qwen3_5_text"),
    "Qwen3_5ForConditionalGeneration": ("Qwen3_5ForCausalLM", False, "qwen3_5", "qwen3_5_text"),
    "Qwen3_5MoeForCausalLM": ("Qwen3_5MoeForCausalLM", True, None, "qwen3_5_moe_text"),
    "Qwen3_5MoeForConditionalGeneration": ("Qwen3_5MoeForCausalLM", True, "qwen3_5_moe", "qwen3_5_moe_text"),
}


def _qwen3_5(cfg: dict, architecture: str) -> ModelSpec:
    """Qwen3.5 / Qwen3.6, dense (`qwen3_5`) or MoE (`qwen3_5_moe`): Qwen3-Next's layers with the Gated
    DeltaNet projections split (models/qwen3_5.py), every layer dense or every layer MoE (the router always
    renormalises its top k). The multimodal checkpoints nest the text model's config under `text_config`;
    the text model is served, and HF ties its embeddings by the outer config's `tie_word_embeddings`.
    Text-only positions are equal on M-RoPE's three axes, so `mrope_section` reduces to plain RoPE."""
    served, moe, outer_type, text_type = _QWEN3_5[architecture]
    text = cfg
    if outer_type is not None:
        model_type = cfg.get("model_type")
        if model_type is not None and model_type != outer_type:
            raise UnsupportedModelError(
                f"config.json names architecture {architecture} but its model_type is {model_type!r} "
                f"(expected {outer_type!r}): refusing to read it as {architecture}"
            )
        if not isinstance(cfg.get("text_config"), dict):
            raise UnsupportedModelError(f"{architecture} config.json has no text_config")
        text = {"dtype": cfg.get("dtype") or cfg.get("torch_dtype"), **cfg["text_config"]}
        text["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    _check_family(
        text, served, (text_type,), (*_GDN_KEYS, *(_QWEN_MOE_KEYS if moe else ("intermediate_size",)))
    )
    if "decoder_sparse_step" in text:
        raise UnsupportedModelError(
            f"{served} config.json has Qwen3-Next's decoder_sparse_step: not a {served}"
        )
    if not moe and text.get("num_experts"):
        raise UnsupportedModelError(
            f"{served} is dense but its config sets num_experts={text['num_experts']}"
        )
    if text.get("attn_output_gate", True) is not True:
        raise UnsupportedModelError(f"{served} without the attention output gate is not supported")
    if (act := text.get("hidden_act", "silu")) != "silu":
        raise UnsupportedModelError(f"{served} hidden_act {act!r} is not supported (only silu)")
    spec = _gdn_hybrid(text, served, [moe] * text["num_hidden_layers"], norm_topk_prob=True)
    spec.extra["config_architecture"] = architecture
    return spec


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
    keys = ("vocab_size", "hidden_size", "mamba_num_heads", "mamba_head_dim", "ssm_state_size")
    _check_family(cfg, "NemotronHForCausalLM", ("nemotron_h",), (*keys, ("n_groups", "mamba_n_groups")))
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
    keys = ("vocab_size", "hidden_size", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim")
    _check_family(
        cfg, "KimiLinearForCausalLM", ("kimi_linear",), (*keys, ("num_experts", "num_local_experts"))
    )
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
        LayerSpec("attention" if t == "full_attention" else "linear", "moe" if m == "sparse" else "mlp")
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


_GRANITE_TYPES = {
    "mamba": "linear", "linear_attention": "linear", "attention": "attention", "full_attention": "attention",
}  # fmt: skip


def _float(value: Any) -> float:
    """A config float, also as transformers 5 writes non-finite ones (`{"__float__": "Infinity"}`)."""
    return float(value["__float__"]) if isinstance(value, dict) else float(value)


def _granite_moe_hybrid(cfg: dict) -> ModelSpec:
    """IBM Granite 4.0-H: Mamba2 and attention layers (`layer_types`, released as "mamba" / "attention"),
    each followed by a SwiGLU shared MLP, plus softmax-routed experts when `num_local_experts` > 0; µP
    multipliers. Absent keys take `GraniteMoeHybridConfig`'s defaults; attention has rotary only when
    `position_embedding_type` is "rope" (HF's test: None and "nope" are both NoPE)."""
    arch = "GraniteMoeHybridForCausalLM"
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "mamba_n_heads")
    _check_family(cfg, arch, ("granitemoehybrid",), (*keys, "mamba_d_state", "shared_intermediate_size"))
    n, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or ["mamba"] * n
    unknown = sorted(set(types) - set(_GRANITE_TYPES))
    if unknown or len(types) != n:
        raise UnsupportedModelError(f"Granite layer_types must be {n} mamba/attention entries, got {types}")
    if (act := cfg.get("hidden_act", "silu")) != "silu":
        raise UnsupportedModelError(f"Granite hidden_act {act!r} is not supported (only silu)")
    position = cfg.get("position_embedding_type")
    if position not in (None, "nope", "rope"):
        raise UnsupportedModelError(f"Granite position_embedding_type {position!r} is not supported")
    rope = _rope(cfg)
    if position == "rope" and rope.get("rope_type", "default") != "default":
        raise UnsupportedModelError(f"Granite rope_type {rope['rope_type']!r} is not supported")
    heads, groups, d_state = cfg["mamba_n_heads"], cfg.get("mamba_n_groups", 1), cfg["mamba_d_state"]
    inner = cfg.get("mamba_expand", 2) * hidden
    d_head = cfg.get("mamba_d_head", "auto")
    d_head = inner // heads if d_head == "auto" else d_head
    if heads * d_head != inner or heads % groups:
        raise UnsupportedModelError(
            f"Granite mamba heads {heads} × head dim {d_head} must be mamba_expand × hidden_size ({inner}) "
            f"and a multiple of mamba_n_groups {groups}"
        )
    limit = cfg.get("time_step_limit") or (0.0, float("inf"))
    attn_heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // attn_heads
    num_experts = cfg.get("num_local_experts", 8)
    shared = cfg["shared_intermediate_size"]
    layers = tuple(LayerSpec(_GRANITE_TYPES[t], "moe" if num_experts > 0 else "mlp") for t in types)
    return ModelSpec(
        architecture=arch,
        layers=layers,
        attention=AttentionSpec(
            num_heads=attn_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or attn_heads,
            head_dim=head_dim,
            v_head_dim=head_dim,
            rotary_dim=head_dim if position == "rope" else 0,
            rope_theta=float(rope["rope_theta"]),
            bias=bool(cfg.get("attention_bias", False)),
            scale=float(cfg.get("attention_multiplier", 1.0)),
        ),
        linear=LinearSpec(
            kind="mamba2",
            num_heads=heads,
            num_k_heads=heads,
            head_k_dim=d_state,
            head_v_dim=d_head,
            conv_kernel=cfg.get("mamba_d_conv", 4),
            conv_channels=inner + 2 * groups * d_state,
            n_groups=groups,
            d_state=d_state,
            conv_bias=bool(cfg.get("mamba_conv_bias", True)),
            proj_bias=bool(cfg.get("mamba_proj_bias", False)),
            time_step_limit=(_float(limit[0]), _float(limit[1])),
            chunk_size=cfg.get("mamba_chunk_size", 256),
        ),
        mlp=MlpSpec(shared, "silu"),  # the shared MLP; in a dense model (no experts) the only FFN
        moe=MoeSpec(
            num_experts=num_experts,
            top_k=cfg.get("num_experts_per_tok", 2),
            intermediate_size=cfg.get("intermediate_size", 11008),
            shared_intermediate_size=shared,
            num_shared_experts=1,
            norm_topk_prob=True,  # softmax over the top k logits
            act="silu",
        )
        if num_experts > 0
        else None,
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
        residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
        logits_scaling=float(cfg.get("logits_scaling", 1.0)),
        **_common(cfg),
    )


PARSERS = {
    "Qwen3NextForCausalLM": _qwen3_next,
    "NemotronHForCausalLM": _nemotron_h,
    "KimiLinearForCausalLM": _kimi_linear,
    "GraniteMoeHybridForCausalLM": _granite_moe_hybrid,
    **{arch: partial(_qwen3_5, architecture=arch) for arch in _QWEN3_5},
}


def spec_of(model: str) -> ModelSpec:
    """The ModelSpec of a preset name or of an HF-format model directory (its config.json alone is read)."""
    from flashstate.spec.preset_configs import PRESETS, preset_config

    return spec_from_hf(preset_config(model) if model in PRESETS else model)


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
