"""IBM Granite 4.0-H (`GraniteMoeHybridForCausalLM`): Mamba2 and attention layers, each followed by a SwiGLU
shared MLP plus, in the MoE models, softmax-routed SwiGLU experts; µP multipliers on the embeddings, the
residual branches, the attention scale and the logits. Each layer:

    h = h + m · mixer(norm(h))                   mixer: Mamba2 (nemotron_h.Mamba2Mixer) or attention
    h = h + m · (shared_mlp(x) [+ moe(x)])       x = norm(h); m = residual_multiplier

The pieces are the other families': the Mamba2 mixer and the attention (NoPE unless
position_embedding_type is "rope") are Nemotron-H's, the RMSNorm Qwen3-Next's without its zero-centring,
the experts Qwen3-Next's SwiGLU MLPs, stacked for the fused kernels (layers/stacked_experts.py).

Module names are the released checkpoints' (what HF's `save_pretrained` writes too):

    model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent when tied)
    model.layers.{i}.{input_layernorm, post_attention_layernorm}.weight
    model.layers.{i}.mamba.{in_proj, conv1d, dt_bias, A_log, D, norm, out_proj}       Mamba2
    model.layers.{i}.self_attn.{q,k,v,o}_proj                                        attention
    model.layers.{i}.shared_mlp.{input_linear [gate | up], output_linear}
    model.layers.{i}.block_sparse_moe.router.layer.weight
    model.layers.{i}.block_sparse_moe.experts.{e}.{gate,up,down}_proj.weight

The checkpoints store each layer's experts fused: `block_sparse_moe.input_linear.weight` [E, 2·I, H] (gate
rows first) and `output_linear.weight` [E, H, I]; `checkpoint_name` names them as transformers 5's fused
experts, which the loader splits into the per-expert parameters. transformers' in-memory names
(`router.weight`, `experts.gate_up_proj` / `down_proj`) are read too.
"""

from __future__ import annotations

import re

import torch.nn.functional as F
from torch import Tensor, nn

from flashstate.layers.metadata import ForwardMetadata
from flashstate.layers.stacked_experts import StackedExperts
from flashstate.models.base import HybridForCausalLM, untied_lm_head
from flashstate.models.nemotron_h import Attention, Mamba2Mixer
from flashstate.models.qwen3_next import Qwen3NextMLP, Qwen3NextRMSNorm, RotaryEmbedding
from flashstate.ops.activation import silu_mul
from flashstate.ops.moe import moe_experts, softmax_topk
from flashstate.spec.model_spec import ModelSpec, MoeSpec, UnsupportedModelError

_ARCH = "GraniteMoeHybridForCausalLM"
# checkpoint spellings → module-tree (or loader-split fused expert) names, within `block_sparse_moe.`
_CHECKPOINT_NAMES = (
    (re.compile(r"\.block_sparse_moe\.input_linear\.weight$"), ".block_sparse_moe.experts.gate_up_proj"),
    (re.compile(r"\.block_sparse_moe\.output_linear\.weight$"), ".block_sparse_moe.experts.down_proj"),
    (re.compile(r"\.block_sparse_moe\.router\.weight$"), ".block_sparse_moe.router.layer.weight"),
)


class GraniteRMSNorm(Qwen3NextRMSNorm):
    """x / rms(x) · w in fp32, cast back to x's dtype; `add_forward` fuses the residual add on CUDA."""

    offset = 0.0


class GraniteMLP(nn.Module):
    """SwiGLU over one fused projection: output_linear(silu(gate) · up), input_linear's rows [gate | up]."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.input_linear = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.output_linear = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.output_linear(silu_mul(self.input_linear(x)))


class GraniteRouter(nn.Module):
    def __init__(self, hidden: int, num_experts: int):
        super().__init__()
        self.layer = nn.Linear(hidden, num_experts, bias=False)


class GraniteMoeHybridMoE(StackedExperts):
    """Routed experts only (the shared MLP is the layer's): the top k router logits, softmaxed over those k
    (= softmax over all experts renormalised over the chosen k)."""

    expert_in_names, expert_out_name = ("gate_proj", "up_proj"), "down_proj"
    expert_act, expert_gated = "silu", True

    def __init__(self, hidden: int, spec: MoeSpec):
        super().__init__()
        self.top_k = spec.top_k
        self.router = GraniteRouter(hidden, spec.num_experts)
        self.experts = nn.ModuleList(
            Qwen3NextMLP(hidden, spec.intermediate_size) for _ in range(spec.num_experts)
        )

    def forward(self, x: Tensor) -> Tensor:
        weights, ids = softmax_topk(self.router.layer(x), self.top_k, renormalize=True)
        return moe_experts(x, weights.to(x.dtype), ids, self.routed_experts())


class GraniteMoeHybridDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int):
        super().__init__()
        layer, d, eps = spec.layers[layer_id], spec.hidden_size, spec.norm_eps
        self.mixer, self.multiplier = layer.mixer, spec.residual_multiplier
        if layer.mixer == "linear":
            self.mamba = Mamba2Mixer(d, spec.linear, eps)
        elif layer.mixer == "attention":
            self.self_attn = Attention(d, spec.attention)
        else:
            raise UnsupportedModelError(f"Granite layer {layer_id} has no token mixer")
        self.block_sparse_moe = GraniteMoeHybridMoE(d, spec.moe) if layer.ffn == "moe" else None
        shared = spec.moe.shared_intermediate_size if layer.ffn == "moe" else spec.mlp.intermediate_size
        self.shared_mlp = GraniteMLP(d, shared)
        self.input_layernorm = GraniteRMSNorm(d, eps)
        self.post_attention_layernorm = GraniteRMSNorm(d, eps)

    def forward(
        self, x: Tensor, residual: Tensor | None, meta: ForwardMetadata, rope: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor]:
        """The layer's input is residual + x (x alone for the first layer); returns (the FFN branch, already
        × residual_multiplier, and the residual stream before it): their sum is the layer's output."""
        h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.mamba(h, meta) if self.mixer == "linear" else self.self_attn(h, meta, rope)
        h, residual = self.post_attention_layernorm.add_forward(h * self.multiplier, residual)
        out = self.shared_mlp(h)
        if self.block_sparse_moe is not None:
            out = self.block_sparse_moe(h) + out
        return out * self.multiplier, residual


class GraniteMoeHybridModel(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.embedding_multiplier = spec.embedding_multiplier
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(GraniteMoeHybridDecoderLayer(spec, i) for i in range(spec.num_layers))
        self.norm = GraniteRMSNorm(spec.hidden_size, spec.norm_eps)
        a = spec.attention
        self.rotary_emb = RotaryEmbedding(a.rotary_dim, a.rope_theta) if a.rotary_dim else None

    def forward(self, input_ids: Tensor, meta: ForwardMetadata) -> Tensor:
        x = self.embed_tokens(input_ids) * self.embedding_multiplier
        rope = None if self.rotary_emb is None else self.rotary_emb(meta.positions, x.dtype)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, meta, rope)
        return self.norm.add_forward(x, residual)[0]


class GraniteMoeHybridForCausalLM(HybridForCausalLM):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.architecture != _ARCH:
            raise ValueError(f"spec is for {spec.architecture}, not {_ARCH}")
        self.spec = spec
        self.model = GraniteMoeHybridModel(spec)
        self.lm_head = untied_lm_head(spec)  # the released models tie it

    def forward(self, input_ids: Tensor, meta: ForwardMetadata) -> Tensor:
        return self.model(input_ids, meta)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.output_weight()).float() / self.spec.logits_scaling

    def post_load(self) -> None:
        if self.model.rotary_emb is not None:
            self.model.rotary_emb.reset()

    def checkpoint_name(self, name: str) -> str:
        for pattern, replacement in _CHECKPOINT_NAMES:
            if pattern.search(name):
                return pattern.sub(replacement, name)
        return name
