"""Qwen3-Next: Gated DeltaNet layers + gated full-attention layers, each followed by an MoE (routed
experts + a sigmoid-gated shared expert) or a dense SwiGLU MLP.

Module and parameter names are those HF `save_pretrained` writes (`model.layers.{i}.linear_attn.*`,
`model.layers.{i}.self_attn.*`, `model.layers.{i}.mlp.experts.{e}.gate_proj.weight`, ...).

Norms: every RMSNorm is zero-centred (`x̂ · (1 + w)`, computed in fp32) except the gated norm on the
GDN output, which is `w · x̂ · silu(z)` with `w` initialised to ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashstate.layers.metadata import ForwardMetadata
from flashstate.layers.stacked_experts import StackedExperts
from flashstate.layers.stacked_linear import StackedLinears
from flashstate.models.base import AttentionMixer, HybridForCausalLM, LinearMixer, untied_lm_head
from flashstate.ops.activation import sigmoid_mul, silu_mul
from flashstate.ops.attention import paged_attention
from flashstate.ops.backend import dense_on_cpu, gpu_kernels
from flashstate.ops.fp8.block_quant import BLOCK
from flashstate.ops.gated_delta_rule import chunk_gated_delta_rule, decode_gated_delta_rule_in_place
from flashstate.ops.gdn_gating import gdn_gating
from flashstate.ops.moe import moe_experts, softmax_topk
from flashstate.ops.norm.naive import rms_norm as naive_rms_norm
from flashstate.ops.qk_norm_rope import qk_norm_rope_store
from flashstate.ops.short_conv import causal_conv1d
from flashstate.spec.model_spec import AttentionSpec, LinearSpec, ModelSpec, MoeSpec, UnsupportedModelError


def _check_act(act: str) -> None:
    if act != "silu":
        raise UnsupportedModelError(f"Qwen3-Next hidden_act {act!r} is not supported (only silu)")


class Qwen3NextRMSNorm(nn.Module):
    """Zero-centred RMSNorm: y = x / rms(x) · (1 + w), in fp32, cast back to x's dtype. A subclass may set
    `offset = 0.0` for the plain x / rms(x) · w."""

    offset = 1.0

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - self.offset))  # the identity

    def forward(self, x: Tensor) -> Tensor:
        if gpu_kernels(x):
            from flashstate.ops.norm.triton import rms_norm

            return rms_norm(x, self.weight, self.eps, offset=self.offset)
        return naive_rms_norm(x, self.weight, self.eps, offset=self.offset)

    def add_forward(self, x: Tensor, residual: Tensor | None) -> tuple[Tensor, Tensor]:
        """s = residual + x (x alone when residual is None) → (norm(s), s); one fused kernel on CUDA."""
        if residual is None:
            return self(x), x
        if gpu_kernels(x):
            from flashstate.ops.norm.triton import add_rms_norm

            return add_rms_norm(x, residual, self.weight, self.eps, offset=self.offset)
        s = residual + x
        return self(s), s


class Qwen3NextRMSNormGated(nn.Module):
    """y = w · (x / rms(x)) · silu(z); the normalised x is cast to x's dtype before the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        if gpu_kernels(x):
            from flashstate.ops.norm.triton import gated_rms_norm

            return gated_rms_norm(x, z, self.weight, self.eps)
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (self.weight * h * F.silu(dense_on_cpu(z.float()))).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary tables for the first `dim` dims of each head (NeoX halves layout)."""

    inv_freq: Tensor

    def __init__(self, dim: int, theta: float):
        super().__init__()
        self.dim, self.theta = dim, theta
        # computed only off the meta device (a meta model gets its values when moved: `_apply`)
        self.register_buffer("inv_freq", torch.empty((dim + 1) // 2), persistent=False)
        if self.inv_freq.device.type != "meta":
            self.reset()

    def _inv_freq(self, device: torch.device | None = None) -> Tensor:
        exponents = torch.arange(0, self.dim, 2, dtype=torch.float32, device=device) / self.dim
        return 1.0 / (self.theta**exponents)

    def reset(self) -> None:
        self.inv_freq = self._inv_freq(self.inv_freq.device)

    def _apply(self, fn, recurse=True):
        # inv_freq stays exact fp32 whatever dtype the model is cast to (as in HF).
        super()._apply(fn, recurse)
        if self.inv_freq.device.type != "meta":
            self.reset()
        return self

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions: [T] → cos, sin: [T, dim]."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Qwen3NextAttention(StackedLinears, AttentionMixer):
    """GQA with per-head q/k RMSNorm, partial rotary, and a sigmoid output gate emitted by q_proj. Without
    biases, q/k/v_proj run as one GEMM; q and v are then strided views of its output."""

    stacked_names = ("q_proj", "k_proj", "v_proj")

    def __init__(self, hidden: int, spec: AttentionSpec, eps: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.scale = spec.head_dim**-0.5
        self.q_proj = nn.Linear(hidden, spec.num_heads * spec.head_dim * 2, bias=spec.bias)
        self.k_proj = nn.Linear(hidden, spec.num_kv_heads * spec.head_dim, bias=spec.bias)
        self.v_proj = nn.Linear(hidden, spec.num_kv_heads * spec.head_dim, bias=spec.bias)
        self.o_proj = nn.Linear(spec.num_heads * spec.head_dim, hidden, bias=spec.bias)
        self.q_norm = Qwen3NextRMSNorm(spec.head_dim, eps)
        self.k_norm = Qwen3NextRMSNorm(spec.head_dim, eps)

    def forward(self, x: Tensor, meta: ForwardMetadata, rope: tuple[Tensor, Tensor]) -> Tensor:
        t = x.shape[0]
        if self.q_proj.bias is None:
            widths = [2 * self.num_heads * self.head_dim] + [self.num_kv_heads * self.head_dim] * 2
            qg, k, v = self.stacked_linear(x).split(widths, dim=-1)
        else:
            qg, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        # q_proj emits, per head, [query (head_dim) | gate (head_dim)]
        q, gate = qg.view(t, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        kv_shape = (t, self.num_kv_heads, self.head_dim)
        q = qk_norm_rope_store(
            q, k.view(kv_shape), v.view(kv_shape), self.q_norm.weight, self.k_norm.weight,
            eps=self.q_norm.eps, offset=1.0, cos=rope[0], sin=rope[1], k_cache=self.k_cache,
            v_cache=self.v_cache, slot_mapping=meta.slot_mapping,
        )  # fmt: skip
        o = paged_attention(
            q, self.k_cache, self.v_cache, cu_seqlens=meta.cu_seqlens, context_lens=meta.context_lens,
            block_tables=meta.block_tables, scale=self.scale, spans=meta.spans,
        )
        o = sigmoid_mul(o, gate)  # gate: a strided [T, H, D] view
        return self.o_proj(o.reshape(t, -1))


class Qwen3NextGatedDeltaNet(StackedLinears, LinearMixer):
    """Gated DeltaNet. The checkpoint's in_proj_qkvz emits, per key head group (one key head and the
    HV/Hk value heads it serves), [q (dk) | k (dk) | v (HV/Hk·dv) | z (HV/Hk·dv)], and in_proj_ba
    [b (HV/Hk) | a (HV/Hk)]; `checkpoint_rows_to_blocks` re-orders their rows at load into
    [q all heads | k | v | z] and [b all heads | a], so one GEMM's output splits into contiguous column
    blocks. q, k, v go through the short causal conv (channels [q all heads | k all heads | v all heads]),
    which hands them back as three contiguous tensors. Both projections run as one GEMM. A subclass may
    name and split the projections otherwise (`stacked_names`, `projection_widths`) as long as their
    stacked rows are that block layout (Qwen3.5's in_proj_qkv / z / b / a already are)."""

    stacked_names = ("in_proj_qkvz", "in_proj_ba")

    def __init__(self, hidden: int, spec: LinearSpec, eps: float, act: str):
        super().__init__()
        _check_act(act)
        self.nk, self.nv = spec.num_k_heads, spec.num_heads
        self.dk, self.dv = spec.head_k_dim, spec.head_v_dim
        self.chunk_size = spec.chunk_size
        value_dim = self.nv * self.dv
        self.conv1d = nn.Conv1d(
            spec.conv_channels, spec.conv_channels, spec.conv_kernel, groups=spec.conv_channels,
            bias=spec.conv_bias, padding=spec.conv_kernel - 1,
        )
        for name, width in zip(self.stacked_names, self.projection_widths(), strict=True):
            setattr(self, name, nn.Linear(hidden, width, bias=False))
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.norm = Qwen3NextRMSNormGated(self.dv, eps)
        self.out_proj = nn.Linear(value_dim, hidden, bias=False)

    def projection_widths(self) -> tuple[int, ...]:
        """Output widths of the `stacked_names` projections, in order; their stacked rows always give
        [q all heads | k | v | z | b | a] (once `from_checkpoint` has re-ordered them)."""
        key_dim, value_dim = self.nk * self.dk, self.nv * self.dv
        return (2 * key_dim + 2 * value_dim, 2 * self.nv)

    def checkpoint_rows_to_blocks(self, leaf: str, w: Tensor) -> Tensor:
        """Checkpoint tensor `leaf` (`in_proj_qkvz.weight` / `in_proj_ba.weight`, this rank's key head
        groups) with its rows re-ordered from per-group [q|k|v|z] / [b|a] to one block per part. An FP8
        checkpoint's `weight_scale_inv` (one row per 128 weight rows) moves with its rows, which needs
        every part to be whole 128-row blocks."""
        r = self.nv // self.nk
        parts = [self.dk, self.dk, r * self.dv, r * self.dv] if leaf.startswith("in_proj_qkvz") else [r, r]
        if leaf.endswith(".weight_scale_inv"):
            if any(p % BLOCK for p in parts):
                raise UnsupportedModelError(
                    f"FP8 {leaf.partition('.')[0]}: its per-head-group parts {parts} are not multiples of "
                    f"{BLOCK} rows, so its block scales cannot follow the re-ordered rows"
                )
            parts = [p // BLOCK for p in parts]
        grouped = w.reshape(self.nk, sum(parts), *w.shape[1:]).split(parts, dim=1)
        return torch.cat([p.reshape(-1, *w.shape[1:]) for p in grouped])

    def forward(self, x: Tensor, meta: ForwardMetadata) -> Tensor:
        t = x.shape[0]
        key_dim, value_dim = self.nk * self.dk, self.nv * self.dv
        parts = [2 * key_dim + value_dim, value_dim, self.nv, self.nv]
        mixed, z, b, a = self.stacked_linear(x).split(parts, dim=-1)  # views
        (q, k, v), conv_exported = causal_conv1d(
            mixed, self.conv1d.weight[:, 0], self.conv1d.bias, conv_state_pool=self.conv_state,
            state_indices=meta.state_slots, has_initial_state=meta.has_initial_state,
            cu_seqlens=meta.cu_seqlens, token_seqs=meta.token_seqs, span_ends=meta.last_real,
            export_token_ids=meta.export_token_ids, activation="silu",
            out_splits=[key_dim, key_dim, value_dim],
        )
        qkv = q.view(1, t, self.nk, self.dk), k.view(1, t, self.nk, self.dk), v.view(1, t, self.nv, self.dv)
        pooled = dict(
            state_pool=self.ssm_state, state_indices=meta.state_slots,
            has_initial_state=meta.has_initial_state, export_token_ids=meta.export_token_ids,
            use_qk_l2norm_in_kernel=True,
        )
        if meta.is_decode:  # one token per sequence: the gates are computed inside the step
            o, ssm_exported = decode_gated_delta_rule_in_place(*qkv, a, b, self.A_log, self.dt_bias, **pooled)
        else:
            g, beta = gdn_gating(a, b, self.A_log, self.dt_bias)
            g, beta = self.without_pads(meta, g, beta, dim=0)
            o, ssm_exported = chunk_gated_delta_rule(
                *qkv, g[None], beta[None], cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices,
                chunk_size=self.chunk_size, **pooled,
            )  # fmt: skip
        self.write_exports(meta, conv_exported, ssm_exported)
        o = self.norm(o.view(t, self.nv, self.dv), z.view(t, self.nv, self.dv))
        return self.out_proj(o.reshape(t, -1))


class Qwen3NextMLP(StackedLinears):
    """SwiGLU; gate_proj and up_proj run as one GEMM over their stacked rows, then one fused silu · mul."""

    stacked_names = ("gate_proj", "up_proj")

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(silu_mul(self.stacked_linear(x)))


class Qwen3NextSparseMoeBlock(StackedExperts):
    """Softmax top-k router (optionally renormalised over the top k) + sigmoid-gated shared expert."""

    expert_in_names, expert_out_name = ("gate_proj", "up_proj"), "down_proj"
    expert_act, expert_gated = "silu", True

    def __init__(self, hidden: int, spec: MoeSpec):
        super().__init__()
        _check_act(spec.act)
        self.top_k, self.norm_topk_prob = spec.top_k, spec.norm_topk_prob
        self.gate = nn.Linear(hidden, spec.num_experts, bias=False)
        self.experts = nn.ModuleList(
            Qwen3NextMLP(hidden, spec.intermediate_size) for _ in range(spec.num_experts)
        )
        self.shared_expert = Qwen3NextMLP(hidden, spec.shared_intermediate_size)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        weights, ids = softmax_topk(self.gate(x), self.top_k, self.norm_topk_prob)  # [T, k]
        out = moe_experts(x, weights.to(x.dtype), ids, self.routed_experts())
        return out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class Qwen3NextDecoderLayer(nn.Module):
    linear_mixer: type[Qwen3NextGatedDeltaNet] = Qwen3NextGatedDeltaNet

    def __init__(self, spec: ModelSpec, layer_id: int):
        super().__init__()
        layer, d, eps = spec.layers[layer_id], spec.hidden_size, spec.norm_eps
        self.mixer = layer.mixer
        if layer.mixer == "linear":
            self.linear_attn = self.linear_mixer(d, spec.linear, eps, spec.mlp.act)
        elif layer.mixer == "attention":
            self.self_attn = Qwen3NextAttention(d, spec.attention, eps)
        else:
            raise UnsupportedModelError(f"Qwen3-Next layer {layer_id} has no token mixer")
        if layer.ffn == "moe":
            self.mlp = Qwen3NextSparseMoeBlock(d, spec.moe)
        else:
            _check_act(spec.mlp.act)
            self.mlp = Qwen3NextMLP(d, spec.mlp.intermediate_size)
        self.input_layernorm = Qwen3NextRMSNorm(d, eps)
        self.post_attention_layernorm = Qwen3NextRMSNorm(d, eps)

    def forward(
        self, x: Tensor, residual: Tensor | None, meta: ForwardMetadata, rope: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """The layer's input is residual + x (x alone for the first layer); returns (the FFN's output,
        the residual stream before it): their sum is the layer's output. Each residual add is fused into
        the norm that follows it."""
        h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.linear_attn(h, meta) if self.mixer == "linear" else self.self_attn(h, meta, rope)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp(h), residual


class Qwen3NextModel(nn.Module):
    decoder_layer: type[Qwen3NextDecoderLayer] = Qwen3NextDecoderLayer

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(self.decoder_layer(spec, i) for i in range(spec.num_layers))
        self.norm = Qwen3NextRMSNorm(spec.hidden_size, spec.norm_eps)
        a = spec.attention
        self.rotary_emb = RotaryEmbedding(a.rotary_dim, a.rope_theta)

    def forward(self, input_ids: Tensor, meta: ForwardMetadata) -> Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary_emb(meta.positions, x.dtype)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, meta, rope)
        return self.norm.add_forward(x, residual)[0]


class Qwen3NextForCausalLM(HybridForCausalLM):
    base_model: type[Qwen3NextModel] = Qwen3NextModel

    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.attention is None or spec.linear is None or spec.mlp is None:
            raise UnsupportedModelError("Qwen3-Next spec needs attention, linear and mlp sections")
        self.spec = spec
        self.model = self.base_model(spec)
        self.lm_head = untied_lm_head(spec)

    def forward(self, input_ids: Tensor, meta: ForwardMetadata) -> Tensor:
        return self.model(input_ids, meta)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.output_weight()).float()

    def post_load(self) -> None:
        self.model.rotary_emb.reset()

    def from_checkpoint(self, name: str, tensor: Tensor) -> Tensor:
        """The Gated DeltaNet input projections' rows go from per-key-head-group to per-part blocks."""
        prefix, _, leaf = name.rpartition(".linear_attn.")
        if leaf.partition(".")[0] in ("in_proj_qkvz", "in_proj_ba"):  # the weight, and an FP8 one's scales
            mixer = self.get_submodule(f"{prefix}.linear_attn")
            assert isinstance(mixer, Qwen3NextGatedDeltaNet)
            return mixer.checkpoint_rows_to_blocks(leaf, tensor)
        return tensor
