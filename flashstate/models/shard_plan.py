"""How a model is split over `world_size` tensor-parallel ranks: the per-rank spec, the slice of every
checkpoint tensor a rank holds, and the modules whose outputs are summed across ranks.

Every family is split the same way (Megatron-style), on the HF parameter names of its module tree:

    column-parallel  (rows split)     q/k/v projections, in_proj*, gate/up projections, per-head params
    row-parallel     (columns split)  o_proj, out_proj, down_proj (Granite: output_linear): each rank
                                      emits a partial sum
    bias of a row-parallel layer      held by rank 0 only (zeros elsewhere), so the sum adds it once
    replicated                        embeddings, lm_head, norms over hidden, routers, low-rank "a"
                                      projections (MLA latents, KDA f_a/g_a), MoE latent projections

Rank r holds heads [r·H/N, (r+1)·H/N) of every head-split layer (attention q and kv heads, Gated
DeltaNet k and v heads, KDA heads, Mamba2 heads with their B/C groups), and the same share of every MLP's
and expert's intermediate channels. Tensors that pack several head-split segments along one dim (the
Gated DeltaNet conv over [q | k | v] and Qwen3.5's in_proj_qkv, Mamba2's in_proj [z | x | B | C | dt],
Granite's shared MLP input_linear [gate | up]) are split per segment.

A layer half (token mixer, FFN) ends in row-parallel layers only, so its output is reduced once:
`reduce_points` names those modules.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from flashstate.spec.model_spec import ModelSpec

Slicer = Callable[[Tensor, int, int], Tensor]  # (full tensor, rank, world size) → this rank's share


class TensorParallelError(ValueError):
    """The model cannot be split over the asked number of ranks."""


@dataclass(frozen=True, slots=True)
class Shard:
    rank: int
    world_size: int


def _split(dim: int) -> Slicer:
    return lambda t, rank, n: t.chunk(n, dim=dim)[rank]


def _segments(sizes: list[int]) -> Slicer:
    """Split dim 0 into consecutive segments of `sizes` (full model), then each segment per rank."""

    def slicer(t: Tensor, rank: int, n: int) -> Tensor:
        return torch.cat([s.chunk(n, dim=0)[rank] for s in t.split(sizes, dim=0)], dim=0)

    return slicer


def _rank0(t: Tensor, rank: int, n: int) -> Tensor:
    return t if rank == 0 else torch.zeros_like(t)


COLUMN, ROW = _split(0), _split(-1)


def _qwen3_next_rules(spec: ModelSpec) -> list[tuple[str, Slicer]]:
    lin = spec.linear
    key_dim, value_dim = lin.num_k_heads * lin.head_k_dim, lin.num_heads * lin.head_v_dim
    ffn = r"\.mlp\.(experts\.\d+\.|shared_expert\.)?"
    return [
        (r"\.self_attn\.[qkv]_proj\.(weight|bias)$", COLUMN),
        (r"\.self_attn\.o_proj\.weight$", ROW),
        (r"\.self_attn\.o_proj\.bias$", _rank0),
        # in_proj_qkvz / in_proj_ba are laid out per key-head group in the checkpoint: a row split keeps
        # whole groups; each rank then re-orders its own groups into blocks (Qwen3Next from_checkpoint).
        (r"\.linear_attn\.in_proj_(qkvz|ba)\.weight$", COLUMN),
        # Qwen3.5 / 3.6 split them by part, each already one block per part: [q | k | v] per segment, the
        # per-value-head z, b, a per head.
        (r"\.linear_attn\.in_proj_qkv\.weight$", _segments([key_dim, key_dim, value_dim])),
        (r"\.linear_attn\.in_proj_[zba]\.weight$", COLUMN),
        (r"\.linear_attn\.conv1d\.(weight|bias)$", _segments([key_dim, key_dim, value_dim])),
        (r"\.linear_attn\.(dt_bias|A_log)$", COLUMN),
        (r"\.linear_attn\.out_proj\.weight$", ROW),
        (ffn + r"(gate|up)_proj\.weight$", COLUMN),
        (ffn + r"down_proj\.weight$", ROW),
    ]


def _nemotron_h_rules(spec: ModelSpec) -> list[tuple[str, Slicer]]:
    lin = spec.linear
    inner, bc = lin.num_heads * lin.head_v_dim, lin.n_groups * lin.d_state
    ffn = r"\.mixer\.(experts\.\d+\.|shared_experts\.)?"
    return [
        (r"\.mixer\.in_proj\.(weight|bias)$", _segments([inner, inner, bc, bc, lin.num_heads])),
        (r"\.mixer\.conv1d\.(weight|bias)$", _segments([inner, bc, bc])),
        (r"\.mixer\.(dt_bias|A_log|D|norm\.weight)$", COLUMN),
        (r"\.mixer\.[qkv]_proj\.(weight|bias)$", COLUMN),
        (r"\.mixer\.(out_proj|o_proj)\.weight$", ROW),
        (r"\.mixer\.(out_proj|o_proj|fc2_latent_proj)\.bias$", _rank0),
        (ffn + r"up_proj\.(weight|bias)$", COLUMN),
        (ffn + r"down_proj\.weight$", ROW),
        (ffn + r"down_proj\.bias$", _rank0),
    ]


def _granite_moe_hybrid_rules(spec: ModelSpec) -> list[tuple[str, Slicer]]:
    lin = spec.linear
    inner, bc = lin.num_heads * lin.head_v_dim, lin.n_groups * lin.d_state
    shared = spec.moe.shared_intermediate_size if spec.moe else spec.mlp.intermediate_size
    return [
        (r"\.mamba\.in_proj\.(weight|bias)$", _segments([inner, inner, bc, bc, lin.num_heads])),
        (r"\.mamba\.conv1d\.(weight|bias)$", _segments([inner, bc, bc])),
        (r"\.mamba\.(dt_bias|A_log|D|norm\.weight)$", COLUMN),
        (r"\.mamba\.out_proj\.weight$", ROW),
        (r"\.self_attn\.[qkv]_proj\.(weight|bias)$", COLUMN),
        (r"\.self_attn\.o_proj\.weight$", ROW),
        (r"\.(mamba\.out_proj|self_attn\.o_proj)\.bias$", _rank0),
        (r"\.shared_mlp\.input_linear\.weight$", _segments([shared, shared])),
        (r"\.shared_mlp\.output_linear\.weight$", ROW),
        (r"\.block_sparse_moe\.experts\.\d+\.(gate|up)_proj\.weight$", COLUMN),
        (r"\.block_sparse_moe\.experts\.\d+\.down_proj\.weight$", ROW),
    ]


def _kimi_linear_rules(spec: ModelSpec) -> list[tuple[str, Slicer]]:
    moe = r"\.block_sparse_moe\.(shared_experts\.)?"
    return [
        # KDA q/k/v and MLA q: rows are per head.
        (r"\.self_attn\.[qkv]_proj\.weight$", COLUMN),
        (r"\.self_attn\.[qkv]_conv1d\.weight$", COLUMN),
        (r"\.self_attn\.(f_b_proj|g_b_proj|b_proj|q_b_proj|kv_b_proj)\.weight$", COLUMN),
        (r"\.self_attn\.dt_bias$", COLUMN),
        (r"\.self_attn\.A_log$", _split(2)),  # [1, 1, H, 1]
        (r"\.self_attn\.o_proj\.weight$", ROW),
        (r"\.self_attn\.o_proj\.bias$", _rank0),
        (r"\.block_sparse_moe\.experts\.\d+\.w[13]\.weight$", COLUMN),
        (r"\.block_sparse_moe\.experts\.\d+\.w2\.weight$", ROW),
        (moe + r"(gate|up)_proj\.weight$", COLUMN),
        (moe + r"down_proj\.weight$", ROW),
    ]


_RULES = {
    "Qwen3NextForCausalLM": _qwen3_next_rules,
    "NemotronHForCausalLM": _nemotron_h_rules,
    "KimiLinearForCausalLM": _kimi_linear_rules,
    "Qwen3_5ForCausalLM": _qwen3_next_rules,
    "Qwen3_5MoeForCausalLM": _qwen3_next_rules,
    "GraniteMoeHybridForCausalLM": _granite_moe_hybrid_rules,
}
# The module whose output closes a layer half (token mixer or FFN), per family.
_REDUCE_POINTS = {
    "Qwen3NextForCausalLM": r"^model\.layers\.\d+\.(self_attn|linear_attn|mlp)$",
    "NemotronHForCausalLM": r"^backbone\.layers\.\d+\.mixer$",
    "KimiLinearForCausalLM": r"^model\.layers\.\d+\.(self_attn|block_sparse_moe)$",
    "Qwen3_5ForCausalLM": r"^model\.layers\.\d+\.(self_attn|linear_attn|mlp)$",
    "Qwen3_5MoeForCausalLM": r"^model\.layers\.\d+\.(self_attn|linear_attn|mlp)$",
    # Granite's FFN half is two modules (shared MLP and routed experts): each output is reduced.
    "GraniteMoeHybridForCausalLM": r"^model\.layers\.\d+\.(mamba|self_attn|shared_mlp|block_sparse_moe)$",
}


def _divide(what: str, value: int, n: int) -> int:
    if value % n:
        raise TensorParallelError(
            f"tensor_parallel_size {n} does not divide the {what} ({value}) of this model"
        )
    return value // n


def shard_spec(spec: ModelSpec, n: int) -> ModelSpec:
    """The spec of one rank's share: every head count and intermediate size divided by `n`."""
    if n == 1:
        return spec
    if spec.architecture not in _RULES:
        raise TensorParallelError(f"no tensor-parallel plan for {spec.architecture}")
    changes: dict = {}
    if (a := spec.attention) is not None and spec.attention_layer_ids:
        changes["attention"] = dataclasses.replace(
            a,
            num_heads=_divide("attention heads", a.num_heads, n),
            num_kv_heads=_divide("attention key/value heads", a.num_kv_heads, n),
        )
    if (lin := spec.linear) is not None and spec.linear_layer_ids:
        heads = _divide(f"{lin.kind} heads", lin.num_heads, n)
        k_heads = _divide(f"{lin.kind} key heads", lin.num_k_heads, n)
        if lin.kind == "gated_deltanet":
            channels = 2 * k_heads * lin.head_k_dim + heads * lin.head_v_dim
        elif lin.kind == "kda":
            channels = 3 * heads * lin.head_k_dim
        else:
            groups = _divide("mamba2 groups (n_groups)", lin.n_groups, n)
            channels = heads * lin.head_v_dim + 2 * groups * lin.d_state
        changes["linear"] = dataclasses.replace(
            lin, num_heads=heads, num_k_heads=k_heads, conv_channels=channels,
            n_groups=lin.n_groups // n if lin.kind == "mamba2" else lin.n_groups,
        )  # fmt: skip
    if (mlp := spec.mlp) is not None and any(layer.ffn == "mlp" for layer in spec.layers):
        size = _divide("MLP intermediate size", mlp.intermediate_size, n)
        changes["mlp"] = dataclasses.replace(mlp, intermediate_size=size)
    if (moe := spec.moe) is not None:
        changes["moe"] = dataclasses.replace(
            moe,
            intermediate_size=_divide("expert intermediate size", moe.intermediate_size, n),
            shared_intermediate_size=_divide(
                "shared expert intermediate size", moe.shared_intermediate_size, n
            ),
        )
    return dataclasses.replace(spec, **changes)


class ShardPlan:
    """The slicing rules of one model (built from its full spec) for one rank."""

    def __init__(self, spec: ModelSpec, shard: Shard):
        if spec.architecture not in _RULES:
            raise TensorParallelError(f"no tensor-parallel plan for {spec.architecture}")
        self.shard = shard
        self.rules = [(re.compile(p), s) for p, s in _RULES[spec.architecture](spec)]

    def slice(self, name: str, tensor: Tensor) -> Tensor:
        """This rank's share of checkpoint tensor `name` (module-tree name); replicated if no rule."""
        for pattern, slicer in self.rules:
            if pattern.search(name):
                return slicer(tensor, self.shard.rank, self.shard.world_size).contiguous()
        return tensor


def reduce_points(architecture: str, module_names: list[str]) -> list[str]:
    """The modules (of `module_names`) whose outputs close a layer half: one all-reduce each."""
    pattern = re.compile(_REDUCE_POINTS[architecture])
    return [n for n in module_names if pattern.match(n)]
