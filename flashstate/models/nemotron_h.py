"""Nemotron-H: a stack of single-mixer blocks — Mamba2, attention (no positional encoding), ReLU² MLP or
ReLU² MoE — each `h = h + mixer(norm(h))`. Parameter names follow HF's `save_pretrained` output:

    backbone.embeddings.weight
    backbone.layers.{i}.norm.weight
    backbone.layers.{i}.mixer.{in_proj, conv1d, dt_bias, A_log, D, norm, out_proj}          Mamba2
    backbone.layers.{i}.mixer.{q_proj, k_proj, v_proj, o_proj}                              attention
    backbone.layers.{i}.mixer.{up_proj, down_proj}                                          MLP
    backbone.layers.{i}.mixer.{gate, experts.{e}.{up,down}_proj, shared_experts,            MoE
                               fc1_latent_proj, fc2_latent_proj}  (latent projections only when set)
    backbone.norm_f.weight, lm_head.weight (never tied)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashstate.layers.metadata import ForwardMetadata
from flashstate.layers.router import GroupedTopkRouter
from flashstate.layers.stacked_experts import StackedExperts
from flashstate.models.base import AttentionMixer, HybridForCausalLM, LinearMixer
from flashstate.ops.attention import paged_attention, store_kv
from flashstate.ops.moe import moe_experts
from flashstate.ops.rotary import apply_rotary_
from flashstate.ops.short_conv import causal_conv1d
from flashstate.ops.ssd import chunk_ssd, fused_recurrent_ssd
from flashstate.spec.model_spec import AttentionSpec, LinearSpec, ModelSpec, MoeSpec


def _act(name: str):
    if name == "relu2":
        return lambda x: F.relu(x).square()
    if name == "silu":
        return F.silu
    raise ValueError(f"unsupported activation {name!r}")


class RMSNorm(nn.Module):
    """x / rms(x) · weight, computed in fp32, cast back to x's dtype after the weight multiply."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * h).to(x.dtype)


class GatedGroupRMSNorm(nn.Module):
    """RMSNorm of y · silu(z) over groups of `group_size` channels (Mamba2's output norm, gate first)."""

    def __init__(self, dim: int, group_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.group_size = group_size
        self.eps = eps

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        h = y.float() * F.silu(z.float())
        h = h.unflatten(-1, (-1, self.group_size))
        h = (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.eps)).flatten(-2)
        return self.weight * h.to(y.dtype)


class Mamba2Mixer(LinearMixer):
    """in_proj → [z | x B C | dt]; causal conv + silu over x‖B‖C; SSD; gated group norm; out_proj.

    State per sequence: conv [inner + 2·G·N, K - 1] and ssm [H, P, N] (`LinearSpec.state_shape`).
    """

    def __init__(self, hidden: int, lin: LinearSpec, eps: float):
        super().__init__()
        self.lin = lin
        self.num_heads, self.head_dim = lin.num_heads, lin.head_v_dim
        self.inner = lin.num_heads * lin.head_v_dim
        self.bc_dim = lin.n_groups * lin.d_state
        self.in_proj = nn.Linear(hidden, self.inner + lin.conv_channels + lin.num_heads, bias=lin.proj_bias)
        channels = lin.conv_channels
        self.conv1d = nn.Conv1d(channels, channels, lin.conv_kernel, groups=channels, bias=lin.conv_bias)
        self.dt_bias = nn.Parameter(torch.zeros(lin.num_heads))
        self.A_log = nn.Parameter(torch.zeros(lin.num_heads))
        self.D = nn.Parameter(torch.ones(lin.num_heads))
        self.norm = GatedGroupRMSNorm(self.inner, self.inner // lin.n_groups, eps)
        self.out_proj = nn.Linear(self.inner, hidden, bias=lin.proj_bias)

    def forward(self, h: Tensor, meta: ForwardMetadata) -> Tensor:
        t = h.shape[0]
        z, xbc, dt = self.in_proj(h).split([self.inner, self.lin.conv_channels, self.num_heads], dim=-1)
        xbc, conv_exported = causal_conv1d(
            xbc,
            self.conv1d.weight.squeeze(1),
            self.conv1d.bias,
            conv_state_pool=self.conv_state,
            state_indices=meta.state_slots,
            has_initial_state=meta.has_initial_state,
            cu_seqlens=meta.cu_seqlens,
            token_seqs=meta.token_seqs,
            span_ends=meta.last_real,
            export_token_ids=meta.export_token_ids,
            activation="silu",
        )
        x, B, C = xbc.split([self.inner, self.bc_dim, self.bc_dim], dim=-1)
        args = (
            x.view(1, t, self.num_heads, self.head_dim),
            dt[None],
            -torch.exp(self.A_log.float()),
            B.view(1, t, self.lin.n_groups, self.lin.d_state),
            C.view(1, t, self.lin.n_groups, self.lin.d_state),
            self.D,
        )
        kwargs = dict(
            dt_bias=self.dt_bias,
            dt_softplus=True,
            dt_limit=self.lin.time_step_limit,
            state_pool=self.ssm_state,
            state_indices=meta.state_slots,
            has_initial_state=meta.has_initial_state,
            cu_seqlens=meta.cu_seqlens,
            export_token_ids=meta.export_token_ids,
        )
        if meta.is_decode:
            y, ssm_exported = fused_recurrent_ssd(*args, **kwargs)
        else:
            y, ssm_exported = chunk_ssd(
                *args, **kwargs, chunk_indices=meta.chunk_indices, real_tokens=meta.real_tokens,
                chunk_size=self.lin.chunk_size,
            )  # fmt: skip
        self.write_exports(meta, conv_exported, ssm_exported)
        y = self.norm(y.view(t, self.inner), z)
        return self.out_proj(y.to(h.dtype))


class Attention(AttentionMixer):
    """GQA over the paged KV pool, scale `AttentionSpec.softmax_scale`; without positional encoding unless the
    caller passes rotary tables (Nemotron-H never does; Granite with position_embedding_type "rope")."""

    def __init__(self, hidden: int, a: AttentionSpec):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = a.num_heads, a.num_kv_heads, a.head_dim
        self.scale = a.softmax_scale
        self.q_proj = nn.Linear(hidden, a.num_heads * a.head_dim, bias=a.bias)
        self.k_proj = nn.Linear(hidden, a.num_kv_heads * a.head_dim, bias=a.bias)
        self.v_proj = nn.Linear(hidden, a.num_kv_heads * a.head_dim, bias=a.bias)
        self.o_proj = nn.Linear(a.num_heads * a.head_dim, hidden, bias=a.bias)

    def forward(self, h: Tensor, meta: ForwardMetadata, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        q = self.q_proj(h).unflatten(-1, (self.num_heads, self.head_dim))
        k = self.k_proj(h).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = self.v_proj(h).unflatten(-1, (self.num_kv_heads, self.head_dim))
        if rope is not None:
            q, k = apply_rotary_(q, *rope), apply_rotary_(k, *rope)
        store_kv(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        o = paged_attention(
            q,
            self.k_cache,
            self.v_cache,
            cu_seqlens=meta.cu_seqlens,
            context_lens=meta.context_lens,
            block_tables=meta.block_tables,
            spans=meta.spans,
            scale=self.scale,
        )
        return self.o_proj(o.flatten(1))


class MLP(nn.Module):
    """Ungated: down_proj(act(up_proj(x)))."""

    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool):
        super().__init__()
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.act = _act(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


class MoE(StackedExperts):
    """Routed ReLU² experts (optionally in a projected latent space) plus an always-on shared expert."""

    expert_in_names, expert_out_name, expert_gated = ("up_proj",), "down_proj", False
    accumulate = torch.float32

    def __init__(self, hidden: int, moe: MoeSpec, bias: bool):
        super().__init__()
        _act(moe.act)  # an unsupported activation fails here
        self.expert_act = moe.act
        width = moe.latent_size or hidden
        self.gate = GroupedTopkRouter(hidden, moe)
        self.experts = nn.ModuleList(
            MLP(width, moe.intermediate_size, moe.act, bias=False) for _ in range(moe.num_experts)
        )
        self.shared_experts = MLP(hidden, moe.shared_intermediate_size, moe.act, bias)
        self.latent = moe.latent_size is not None
        if self.latent:
            self.fc1_latent_proj = nn.Linear(hidden, moe.latent_size, bias=bias)
            self.fc2_latent_proj = nn.Linear(moe.latent_size, hidden, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        weights, ids = self.gate(x)
        h = self.fc1_latent_proj(x) if self.latent else x
        out = moe_experts(h, weights, ids, self.routed_experts())
        if self.latent:
            out = self.fc2_latent_proj(out)
        return out + self.shared_experts(x)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int):
        super().__init__()
        layer, d = spec.layers[layer_id], spec.hidden_size
        self.norm = RMSNorm(d, spec.norm_eps)
        self.kind = layer.mixer or layer.ffn
        if layer.mixer is not None and layer.ffn is not None:
            raise ValueError(f"Nemotron-H layer {layer_id} has both a mixer and an ffn: {layer}")
        if self.kind == "linear":
            self.mixer = Mamba2Mixer(d, spec.linear, spec.norm_eps)
        elif self.kind == "attention":
            self.mixer = Attention(d, spec.attention)
        elif self.kind == "mlp":
            self.mixer = MLP(d, spec.mlp.intermediate_size, spec.mlp.act, spec.mlp.bias)
        else:
            self.mixer = MoE(d, spec.moe, spec.mlp.bias)

    def forward(self, h: Tensor, meta: ForwardMetadata) -> Tensor:
        x = self.norm(h)
        x = self.mixer(x, meta) if self.kind in ("linear", "attention") else self.mixer(x)
        return h + x


class Backbone(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(Block(spec, i) for i in range(spec.num_layers))
        self.norm_f = RMSNorm(spec.hidden_size, spec.norm_eps)


class NemotronHForCausalLM(HybridForCausalLM):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.architecture != "NemotronHForCausalLM":
            raise ValueError(f"spec is for {spec.architecture}, not NemotronHForCausalLM")
        self.spec = spec
        self.backbone = Backbone(spec)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def forward(self, input_ids: Tensor, meta: ForwardMetadata) -> Tensor:
        h = self.backbone.embeddings(input_ids)
        for layer in self.backbone.layers:
            h = layer(h, meta)
        return self.backbone.norm_f(h)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden).float()
