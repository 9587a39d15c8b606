"""Kimi-Linear: Kimi Delta Attention (KDA) layers + MLA full-attention layers (NoPE), dense/MoE FFNs.

Module names mirror what HF `KimiLinearForCausalLM.save_pretrained` writes (Moonshot's checkpoint names):

    model.embed_tokens                      model.norm                     lm_head
    model.layers.N.{input,post_attention}_layernorm
    model.layers.N.self_attn  KDA: {q,k,v}_proj, {q,k,v}_conv1d, f_a_proj, f_b_proj, dt_bias, A_log,
                                   b_proj, g_a_proj, g_b_proj, o_norm, o_proj
                              MLA: q_proj | q_a_proj, q_a_layernorm, q_b_proj;
                                   kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj
    model.layers.N.block_sparse_moe  MoE: gate.{weight, e_score_correction_bias},
                                          experts.E.{w1 (gate), w2 (down), w3 (up)}, shared_experts.*
                                     dense: {gate,up,down}_proj (HF's save names the dense MLP
                                            `block_sparse_moe` too; Moonshot's checkpoints say `mlp`)

MLA here is plain multi-head attention over decompressed keys: k = [k_nope (per head) ‖ k_rope (shared)],
no rotary embedding anywhere (HF and Moonshot apply none), so the paged KV pool stores per-head K
(qk_nope + qk_rope dims) and V (v_head_dim).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashstate.layers.metadata import ForwardMetadata
from flashstate.layers.router import GroupedTopkRouter
from flashstate.layers.stacked_experts import StackedExperts
from flashstate.models.base import AttentionMixer, HybridForCausalLM, LinearMixer
from flashstate.ops.attention import long_spans, paged_attention, span_attention, store_kv
from flashstate.ops.attention.kv_cast import gather_blocks
from flashstate.ops.kda import chunk_kda, fused_recurrent_kda
from flashstate.ops.moe import moe_experts
from flashstate.ops.short_conv import causal_conv1d
from flashstate.spec.model_spec import AttentionSpec, LinearSpec, ModelSpec, MoeSpec

# HF and Moonshot build the MLA latent norms (q_a_layernorm, kv_a_layernorm) with the default eps,
# not rms_norm_eps.
MLA_NORM_EPS = 1e-6
_ACTS = {"silu": F.silu}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class GatedRMSNorm(nn.Module):
    """fp32 RMSNorm over the head dim, times sigmoid(gate)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf * torch.sigmoid(gate.float())).to(x.dtype)


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = _ACTS[act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Expert(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str):
        super().__init__()
        self.w1 = nn.Linear(hidden, intermediate, bias=False)  # gate
        self.w2 = nn.Linear(intermediate, hidden, bias=False)  # down
        self.w3 = nn.Linear(hidden, intermediate, bias=False)  # up
        self.act = _ACTS[act]

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.act(self.w1(x)) * self.w3(x))


class SparseMoe(StackedExperts):
    expert_in_names, expert_out_name, expert_gated = ("w1", "w3"), "w2", True

    def __init__(self, hidden: int, moe: MoeSpec):
        super().__init__()
        self.expert_act = moe.act
        self.gate = GroupedTopkRouter(hidden, moe)
        self.experts = nn.ModuleList(
            Expert(hidden, moe.intermediate_size, moe.act) for _ in range(moe.num_experts)
        )
        self.shared_experts = GatedMLP(hidden, moe.shared_intermediate_size, moe.act)

    def forward(self, x: Tensor) -> Tensor:
        weights, ids = self.gate(x)
        return moe_experts(x, weights, ids, self.routed_experts()) + self.shared_experts(x)


class KimiDeltaAttention(LinearMixer):
    """KDA: q/k/v projections → short conv (silu) → l2-normed q, k → KDA with per-channel decay
    g = -exp(A_log) · softplus(f_b(f_a(x)) + dt_bias) and beta = sigmoid(b_proj(x)) → gated RMSNorm → o_proj.

    conv_state: [slots, 3·H·D, K - 1] holds q ‖ k ‖ v channels; ssm_state: [slots, H, D, D] fp32.
    """

    def __init__(self, hidden: int, lin: LinearSpec, norm_eps: float):
        super().__init__()
        h, d, width = lin.num_heads, lin.head_k_dim, lin.conv_kernel
        self.num_heads, self.head_dim = h, d
        self.q_proj = nn.Linear(hidden, h * d, bias=False)
        self.k_proj = nn.Linear(hidden, h * d, bias=False)
        self.v_proj = nn.Linear(hidden, h * d, bias=False)
        self.q_conv1d = nn.Conv1d(h * d, h * d, width, groups=h * d, bias=False)
        self.k_conv1d = nn.Conv1d(h * d, h * d, width, groups=h * d, bias=False)
        self.v_conv1d = nn.Conv1d(h * d, h * d, width, groups=h * d, bias=False)
        self.f_a_proj = nn.Linear(hidden, d, bias=False)
        self.f_b_proj = nn.Linear(d, h * d, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(h * d))
        self.A_log = nn.Parameter(torch.empty(1, 1, h, 1))
        self.b_proj = nn.Linear(hidden, h, bias=False)
        self.g_a_proj = nn.Linear(hidden, d, bias=False)
        self.g_b_proj = nn.Linear(d, h * d, bias=False)
        self.o_norm = GatedRMSNorm(d, norm_eps)
        self.o_proj = nn.Linear(h * d, hidden, bias=False)

    def decay(self, x: Tensor) -> Tensor:
        """Per-channel log decay, fp32: [T, H, D]."""
        f = self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()
        f = f.view(x.shape[0], self.num_heads, self.head_dim)
        softplus = torch.where(f > 20.0, f, torch.log1p(f.exp()))
        return -self.A_log.float().exp().view(self.num_heads, 1) * softplus

    def forward(self, x: Tensor, meta: ForwardMetadata) -> Tensor:
        t, h, d = x.shape[0], self.num_heads, self.head_dim
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)  # [T, 3·H·D]
        weight = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight])[:, 0]
        mixed, conv_exported = causal_conv1d(
            mixed, weight, None, conv_state_pool=self.conv_state, state_indices=meta.state_slots,
            has_initial_state=meta.has_initial_state, cu_seqlens=meta.cu_seqlens, token_seqs=meta.token_seqs,
            span_ends=meta.last_real, export_token_ids=meta.export_token_ids, activation="silu",
        )
        q, k, v = (y.reshape(1, t, h, d) for y in mixed.split(h * d, dim=-1))
        beta = torch.sigmoid(self.b_proj(x)).unsqueeze(0)
        pooled = dict(
            state_pool=self.ssm_state, state_indices=meta.state_slots,
            has_initial_state=meta.has_initial_state, cu_seqlens=meta.cu_seqlens,
            export_token_ids=meta.export_token_ids, use_qk_l2norm_in_kernel=True,
        )
        g, beta = self.without_pads(meta, self.decay(x).unsqueeze(0), beta, dim=1)
        args = (q, k, v, g, beta)
        if meta.is_decode:
            o, ssm_exported = fused_recurrent_kda(*args, **pooled)
        else:
            o, ssm_exported = chunk_kda(*args, **pooled, chunk_indices=meta.chunk_indices)
        self.write_exports(meta, conv_exported, ssm_exported)
        gate = self.g_b_proj(self.g_a_proj(x)).view(t, h, d)
        return self.o_proj(self.o_norm(o[0], gate).reshape(t, h * d))


class MultiLatentAttention(AttentionMixer):
    """MLA without rotary: q = q_proj(x) (or the q_a → norm → q_b low-rank path); the latent
    kv_a_proj_with_mqa(x) = [c_kv ‖ k_rope], kv_b_proj(norm(c_kv)) = per head [k_nope ‖ v].

    The cache holds the latent [norm(c_kv) ‖ k_rope] once per token for all heads (AttentionSpec.
    cache_*). Attention over the cache runs in latent space with kv_b_proj absorbed: per head,
    q_nope · k_nope = (W_UK^T q_nope) · c_kv, and Σ p · v = W_UV (Σ p · c_kv); one shared KV "head" of
    rank + rope values, the value being its first rank values. A prefill batch of long spans (CUDA; over
    a cached prefix or not) instead expands each sequence's cached latents into per-head K and V and
    goes through fused SDPA: absorbed attention costs (rank + rope + rank) multiply-adds per head and key
    against (nope + rope + v) expanded, 3.4× more for Kimi-Linear's shapes. Both compute the same
    function."""

    def __init__(self, hidden: int, a: AttentionSpec):
        super().__init__()
        self.a = a
        h, nope, rope = a.num_heads, a.qk_nope_head_dim, a.qk_rope_head_dim
        if a.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, h * a.head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, a.q_lora_rank, bias=a.bias)
            self.q_a_layernorm = RMSNorm(a.q_lora_rank, MLA_NORM_EPS)
            self.q_b_proj = nn.Linear(a.q_lora_rank, h * a.head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, a.kv_lora_rank + rope, bias=a.bias)
        self.kv_a_layernorm = RMSNorm(a.kv_lora_rank, MLA_NORM_EPS)
        self.kv_b_proj = nn.Linear(a.kv_lora_rank, h * (nope + a.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * a.v_head_dim, hidden, bias=a.bias)

    def forward(self, x: Tensor, meta: ForwardMetadata) -> Tensor:
        a, t = self.a, x.shape[0]
        h = a.num_heads
        if a.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([a.kv_lora_rank, a.qk_rope_head_dim], dim=-1)
        c = self.kv_a_layernorm(latent)
        store_kv(
            torch.cat([c, k_rope], -1)[:, None], c[:, None], self.k_cache, self.v_cache, meta.slot_mapping
        )
        q = q.view(t, h, a.head_dim)
        long = long_spans(q, meta.cu_seqlens, meta.spans)
        o = self.attend_expanded(q, meta) if long else self.attend_latent(q, meta)
        return self.o_proj(o.reshape(t, h * a.v_head_dim))

    def attend_latent(self, q: Tensor, meta: ForwardMetadata) -> Tensor:
        """q [T, H, nope + rope] over the cached latents, kv_b_proj absorbed → [T, H, v_head_dim]."""
        a, h = self.a, self.a.num_heads
        w_uk, w_uv = self.kv_b_proj.weight.view(h, -1, a.kv_lora_rank).split(
            [a.qk_nope_head_dim, a.v_head_dim], 1
        )
        q_nope, q_rope = q.split([a.qk_nope_head_dim, a.qk_rope_head_dim], dim=-1)
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, rank]
        o = paged_attention(
            torch.cat([q_latent, q_rope], -1), self.k_cache, self.v_cache, cu_seqlens=meta.cu_seqlens,
            context_lens=meta.context_lens, block_tables=meta.block_tables, scale=a.head_dim**-0.5,
            spans=meta.spans,
        )  # [T, H, rank]  # fmt: skip
        return torch.bmm(o.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)

    def attend_expanded(self, q: Tensor, meta: ForwardMetadata) -> Tensor:
        """q [T, H, nope + rope]: each span's queries over its whole context, K = [k_nope ‖ k_rope] and V
        expanded per head from the cached latents (the span's own included) → [T, H, v_head_dim]."""
        a, h = self.a, self.a.num_heads
        block_size = self.k_cache.shape[1]
        bounds = meta.cu_seqlens.tolist()
        outs = []
        for i, ctx in enumerate(meta.context_lens.tolist()):
            table = meta.block_tables[i, : -(-ctx // block_size)]
            latents = gather_blocks(self.k_cache, table).flatten(0, 2)[:ctx].to(q.dtype)  # [ctx, rank + rope]
            c, k_rope = latents.split([a.kv_lora_rank, a.qk_rope_head_dim], -1)
            k_nope, v = self.kv_b_proj(c).view(ctx, h, -1).split([a.qk_nope_head_dim, a.v_head_dim], dim=-1)
            k = torch.cat([k_nope, k_rope[:, None, :].expand(ctx, h, a.qk_rope_head_dim)], dim=-1)
            outs.append(span_attention(q[bounds[i] : bounds[i + 1]], k, v, scale=a.head_dim**-0.5))
        return outs[0] if len(outs) == 1 else torch.cat(outs)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, i: int):
        super().__init__()
        layer, d = spec.layers[i], spec.hidden_size
        if layer.mixer == "attention":
            self.self_attn: nn.Module = MultiLatentAttention(d, spec.attention)
        else:
            self.self_attn = KimiDeltaAttention(d, spec.linear, spec.norm_eps)
        if layer.ffn == "moe":
            self.block_sparse_moe: nn.Module = SparseMoe(d, spec.moe)
        else:
            self.block_sparse_moe = GatedMLP(d, spec.mlp.intermediate_size, spec.mlp.act)
        self.input_layernorm = RMSNorm(d, spec.norm_eps)
        self.post_attention_layernorm = RMSNorm(d, spec.norm_eps)

    def forward(self, x: Tensor, meta: ForwardMetadata) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), meta)
        return x + self.block_sparse_moe(self.post_attention_layernorm(x))


class KimiLinearModel(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps)

    def forward(self, input_ids: Tensor, meta: ForwardMetadata) -> Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, meta)
        return self.norm(x)


# Moonshot's checkpoints name the dense FFN `mlp`; the module tree follows HF's save (`block_sparse_moe`).
_DENSE_MLP_ALIAS = re.compile(r"^(model\.layers\.\d+)\.mlp\.")


class KimiLinearForCausalLM(HybridForCausalLM):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.attention_layer_ids and spec.attention.kv_lora_rank is None:
            raise ValueError("Kimi-Linear attention layers are MLA: the spec needs kv_lora_rank")
        self.spec = spec
        self.model = KimiLinearModel(spec)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)  # never tied (as in HF)

    def forward(self, input_ids: Tensor, meta: ForwardMetadata) -> Tensor:
        return self.model(input_ids, meta)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden).float()

    def checkpoint_name(self, name: str) -> str:
        return _DENSE_MLP_ALIAS.sub(r"\1.block_sparse_moe.", name)
