"""Parameter counts of the HF model a ModelSpec describes, from its shapes alone (no weights built)."""

from __future__ import annotations

import torch

from flashstate.layers.fp8_linear import convert_linears
from flashstate.models.registry import build_meta_model
from flashstate.spec.model_spec import ModelSpec
from flashstate.spec.quantization import Fp8BlockConfig


def count_parameters(spec: ModelSpec, embeddings: bool = True) -> int:
    """Parameters of the HF model `spec` describes (buffers such as router correction biases excluded);
    `embeddings=False` leaves out the input embedding and the LM head."""
    h = spec.hidden_size
    per_layer = {"attention": _attention_params(spec), "linear": _linear_params(spec), None: 0}
    ffn = {"mlp": _mlp_params(spec), "moe": _moe_params(spec), None: 0}
    nemotron = spec.architecture == "NemotronHForCausalLM"
    total = h  # final norm
    for layer in spec.layers:
        norms = h if nemotron else 2 * h  # Nemotron-H: one pre-norm per block (mixer or FFN)
        total += norms + per_layer[layer.mixer] + ffn[layer.ffn]
    if embeddings:
        total += spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    return total


def count_active_parameters(spec: ModelSpec, embeddings: bool = True) -> int:
    """Parameters one token's forward uses: `count_parameters` less, in every MoE layer, the routed experts
    it does not choose (all but `top_k`)."""
    total = count_parameters(spec, embeddings)
    e = spec.moe
    if e is None:
        return total
    idle = (e.num_experts - e.top_k) * _ffn(e.latent_size or spec.hidden_size, e.intermediate_size, e.act)
    return total - idle * sum(layer.ffn == "moe" for layer in spec.layers)


def _attention_params(spec: ModelSpec) -> int:
    a, h = spec.attention, spec.hidden_size
    if a is None:
        return 0
    if a.kv_lora_rank is not None:  # MLA
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank is None:
            q = h * a.num_heads * qk
        else:
            q = h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * a.num_heads * qk
        kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
        kv += a.kv_lora_rank * a.num_heads * (a.qk_nope_head_dim + a.v_head_dim)
        return q + kv + a.num_heads * a.v_head_dim * h
    q_out = a.num_heads * a.head_dim * (2 if a.output_gate else 1)
    kv_out = 2 * a.num_kv_heads * a.head_dim
    o_in = a.num_heads * a.v_head_dim
    total = h * (q_out + kv_out) + o_in * h + (2 * a.head_dim if a.qk_norm else 0)
    return total + (q_out + kv_out + h if a.bias else 0)


def _linear_params(spec: ModelSpec) -> int:
    m, h = spec.linear, spec.hidden_size
    if m is None:
        return 0
    conv = m.conv_channels * m.conv_kernel + (m.conv_channels if m.conv_bias else 0)
    if m.kind == "gated_deltanet":
        nk, nv, dk, dv = m.num_k_heads, m.num_heads, m.head_k_dim, m.head_v_dim
        proj = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + nv * dv * h
        return proj + conv + 2 * nv + dv  # + dt_bias, A_log, gated norm
    if m.kind == "kda":
        hd, d = m.num_heads * m.head_k_dim, m.head_k_dim
        proj = 3 * h * hd + hd * h + h * m.num_heads  # q, k, v, o, beta
        gates = 2 * (h * d + d * hd)  # forget gate and output gate, both low rank
        return proj + gates + conv + hd + m.num_heads + d  # + dt_bias, A_log, o_norm
    inner = m.num_heads * m.head_v_dim  # mamba2
    in_out = h * (2 * inner + 2 * m.n_groups * m.d_state + m.num_heads)
    bias = (in_out // h + h) if m.proj_bias else 0
    return in_out + inner * h + bias + conv + 3 * m.num_heads + inner  # + dt_bias, A_log, D, norm


def _mlp_params(spec: ModelSpec) -> int:
    if spec.mlp is None:
        return 0
    return _ffn(spec.hidden_size, spec.mlp.intermediate_size, spec.mlp.act, spec.mlp.bias)


def _ffn(h: int, inter: int, act: str, bias: bool = False) -> int:
    gated = act != "relu2"
    return h * inter * (3 if gated else 2) + ((2 * inter if gated else inter) + h if bias else 0)


def _moe_params(spec: ModelSpec) -> int:
    e, h = spec.moe, spec.hidden_size
    if e is None:
        return 0
    bias = (
        spec.mlp.bias if spec.mlp is not None else False
    )  # Nemotron-H: shared expert and latent projections
    width = e.latent_size or h  # Nemotron-H latent MoE: routed experts run at `latent_size`
    experts = e.num_experts * _ffn(width, e.intermediate_size, e.act)
    latent = 2 * h * e.latent_size + (e.latent_size + h if bias else 0) if e.latent_size else 0
    shared = _ffn(h, e.shared_intermediate_size, e.act, bias) if e.shared_intermediate_size else 0
    return e.num_experts * h + experts + latent + shared + (h if e.shared_expert_gate else 0)


# --- random weights and model directories ----------------------------------------------------------------


def weight_bytes(spec: ModelSpec, quant: Fp8BlockConfig | None = None, active: bool = False) -> int:
    """Bytes of the weights (parameters and persistent buffers) of the model `spec` describes, as flashstate
    builds it: with `quant`, the linears `converts_linear` picks hold float8_e4m3fn weights (1 byte each)
    plus an fp32 scale per 128×128 block, the rest `spec.dtype`. `active`: the bytes one token's forward
    reads (every MoE layer's routed experts but `top_k` left out). Built on the meta device: no memory."""
    model = build_meta_model(spec).to(spec.dtype)
    if quant is not None:
        convert_linears(model, quant)  # on the meta device too: each new layer goes where the old one was
    state = model.state_dict(keep_vars=True)
    total = sum(t.numel() * t.element_size() for t in state.values())
    if active and spec.moe is not None:
        for name, module in model.named_modules():
            if name.endswith(".experts") and isinstance(module, torch.nn.ModuleList):
                expert = sum(t.numel() * t.element_size() for t in module[0].state_dict().values())
                total -= expert * (len(module) - spec.moe.top_k)
    return total
