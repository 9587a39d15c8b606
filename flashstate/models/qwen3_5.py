"""Qwen3.5 / Qwen3.6 text models, dense (`Qwen3_5ForCausalLM`) and MoE (`Qwen3_5MoeForCausalLM`): Qwen3-Next's
layers (models/qwen3_next.py: gated attention, zero-centred norms, SwiGLU MLP, softmax-routed experts with
a gated shared expert), with the Gated DeltaNet input projections split by part:

    in_proj_qkv  [q all heads | k all heads | v all heads]     in_proj_z  [z all heads]
    in_proj_b    [b all heads]                                 in_proj_a  [a all heads]

Stacked in that order they are already the block layout Qwen3-Next's forward splits (Qwen3-Next re-orders
its per-key-head-group in_proj_qkvz / in_proj_ba rows into it at load), so no row is moved at load.

Checkpoint names: `model.layers.*` (HF's `Qwen3_5ForCausalLM`) or `model.language_model.*` (the released
multimodal checkpoints, `Qwen3_5(Moe)ForConditionalGeneration`, served as their text model: the loader
skips `model.visual.*` and the `mtp.*` head). Released MoE checkpoints may store each layer's experts fused
(`mlp.experts.gate_up_proj` / `down_proj`); the loader splits them into the per-expert parameters.
"""

from __future__ import annotations

from torch import Tensor

from flashstate.models.qwen3_next import (
    Qwen3NextDecoderLayer,
    Qwen3NextForCausalLM,
    Qwen3NextGatedDeltaNet,
    Qwen3NextModel,
)

_MULTIMODAL_PREFIX = "model.language_model."


class Qwen3_5GatedDeltaNet(Qwen3NextGatedDeltaNet):
    stacked_names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")

    def projection_widths(self) -> tuple[int, ...]:
        key_dim, value_dim = self.nk * self.dk, self.nv * self.dv
        return (2 * key_dim + value_dim, value_dim, self.nv, self.nv)


class Qwen3_5DecoderLayer(Qwen3NextDecoderLayer):
    linear_mixer = Qwen3_5GatedDeltaNet


class Qwen3_5Model(Qwen3NextModel):
    decoder_layer = Qwen3_5DecoderLayer


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    """Both variants: the spec says which layers carry an MoE (all of them, or none)."""

    base_model = Qwen3_5Model

    def checkpoint_name(self, name: str) -> str:
        if name.startswith(_MULTIMODAL_PREFIX):
            return "model." + name.removeprefix(_MULTIMODAL_PREFIX)
        return name

    def from_checkpoint(self, name: str, tensor: Tensor) -> Tensor:
        return tensor  # the split projections are stored in the block layout already
