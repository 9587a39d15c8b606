"""ModelSpec: a frozen, normalised description of a hybrid model.

`hf_config.spec_from_hf(config)` is the one place HF config names are read. Everything downstream (models,
pools, cost model, presets) reads the spec, never the raw config.

A layer is a `LayerSpec(mixer, ffn)`:
    mixer ∈ {"attention", "linear", None}   token mixing (None: Nemotron-H MLP/MoE-only layers)
    ffn   ∈ {"mlp", "moe", None}            channel mixing (None: Nemotron-H mixer-only layers)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

# The `architectures` names of config.json that flashstate serves, matched exactly. The multimodal Qwen3.5
# checkpoints (`...ForConditionalGeneration`) are served as their text model (`spec.architecture` is the
# text model's `...ForCausalLM`; the vision tower's tensors are skipped at load).
SUPPORTED_ARCHITECTURES = (
    "Qwen3NextForCausalLM",
    "NemotronHForCausalLM",
    "KimiLinearForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "GraniteMoeHybridForCausalLM",
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class LayerSpec:
    mixer: Literal["attention", "linear"] | None
    ffn: Literal["mlp", "moe"] | None


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """Full-attention layers. `head_dim` is the q·k dim, `v_head_dim` the value dim."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    rotary_dim: int  # 0: no rotary embedding (NoPE)
    rope_theta: float
    bias: bool = False
    output_gate: bool = False  # Qwen3-Next: q_proj also emits a sigmoid gate on the output
    scale: float | None = None  # softmax scale; None: head_dim^-0.5 (Granite's attention_multiplier)
    qk_norm: bool = False
    # Multi-head latent attention (Kimi-Linear); None for plain GQA.
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None

    # What the KV cache holds per token and layer. MLA caches the latent, shared by every head: one
    # "head" of [c_kv ‖ k_rope] as the key, whose first kv_lora_rank values are the value (a view).
    @property
    def latent_cache(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5 if self.scale is None else self.scale

    @property
    def cache_kv_heads(self) -> int:
        return 1 if self.latent_cache else self.num_kv_heads

    @property
    def cache_k_dim(self) -> int:
        if self.latent_cache:
            return self.kv_lora_rank + (self.qk_rope_head_dim or 0)
        return self.head_dim

    @property
    def cache_v_dim(self) -> int:
        return self.kv_lora_rank if self.latent_cache else self.v_head_dim


@dataclass(frozen=True, slots=True)
class LinearSpec:
    """Linear-attention / SSM layers; the recurrent state per sequence is [num_heads, k_dim, v_dim].

    kind           heads                     k_dim          v_dim        conv channels
    gated_deltanet num_v_heads (q/k: num_k)  head_k_dim     head_v_dim   2·nk·dk + nv·dv
    kda            num_heads                 head_dim       head_dim     3·h·d (q, k, v convs)
    mamba2         num_heads                 d_state        head_dim     inner + 2·n_groups·d_state
    Mamba2's state is stored [heads, head_dim, d_state] as in HF; `state_shape` returns it as is.
    """

    kind: Literal["gated_deltanet", "kda", "mamba2"]
    num_heads: int
    num_k_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    conv_channels: int
    n_groups: int = 1  # mamba2
    d_state: int = 0  # mamba2
    conv_bias: bool = False
    proj_bias: bool = False
    time_step_limit: tuple[float, float] = (0.0, float("inf"))  # mamba2
    chunk_size: int = 64

    @property
    def state_shape(self) -> tuple[int, int, int]:
        if self.kind == "mamba2":
            return (self.num_heads, self.head_v_dim, self.d_state)
        return (self.num_heads, self.head_k_dim, self.head_v_dim)

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        """The last `conv_kernel - 1` conv inputs: [channels, kernel - 1]."""
        return (self.conv_channels, self.conv_kernel - 1)


@dataclass(frozen=True, slots=True)
class MlpSpec:
    intermediate_size: int
    act: str  # "silu" (gated SwiGLU) or "relu2" (Nemotron-H, ungated)
    bias: bool = False


@dataclass(frozen=True, slots=True)
class MoeSpec:
    num_experts: int
    top_k: int
    intermediate_size: int
    shared_intermediate_size: int  # 0: no shared expert
    num_shared_experts: int
    norm_topk_prob: bool
    act: str
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    shared_expert_gate: bool = False  # Qwen3-Next: sigmoid gate on the shared expert
    correction_bias: bool = False  # e_score_correction_bias (DeepSeek-style routers)
    latent_size: int | None = None  # Nemotron-H: routed experts run in a projected latent space


@dataclass(frozen=True, slots=True)
class ModelSpec:
    architecture: str
    vocab_size: int
    hidden_size: int
    layers: tuple[LayerSpec, ...]
    attention: AttentionSpec | None
    linear: LinearSpec | None
    mlp: MlpSpec | None
    moe: MoeSpec | None
    norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    dtype: torch.dtype = torch.float32
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    # µP multipliers (Granite): embeddings × embedding_multiplier; every residual branch × residual_multiplier
    # before its add; logits ÷ logits_scaling.
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def attention_layer_ids(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if layer.mixer == "attention"]

    @property
    def linear_layer_ids(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if layer.mixer == "linear"]

    @property
    def cuda_graph_safe(self) -> bool:
        """The forward never waits on the device on CUDA, so decode and mixed steps can be captured: every
        family's MoE layers route and run their experts with the fused kernels (ops/moe). Only the
        reference ops' oracle loop reads the chosen experts on the host; its capture fails and the
        runner stays eager."""
        return True
