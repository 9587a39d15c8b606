"""What every model family provides to the engine.

A family's `nn.Module` tree mirrors its HF checkpoint names and shapes (a family may hold some rows in
another order: `from_checkpoint`). Its attention mixers carry `k_cache` and
`v_cache` (the paged KV pool of that layer) and its linear mixers carry `conv_state` and `ssm_state`
(that layer's share of the state pool); `bind_caches` hands them their tensors, in layer order.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from flashstate.layers.metadata import ForwardMetadata
from flashstate.spec.model_spec import ModelSpec


class AttentionMixer(nn.Module):
    """Marker base for layers that read and write the paged KV pool."""

    k_cache: Tensor
    v_cache: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)


class LinearMixer(nn.Module):
    """Marker base for layers whose per-sequence state lives in the state pool."""

    conv_state: Tensor  # [num_slots, conv_channels, conv_kernel - 1]
    ssm_state: Tensor  # [num_slots, *LinearSpec.state_shape], fp32

    def __init__(self) -> None:
        super().__init__()
        self.conv_state = torch.empty(0)
        self.ssm_state = torch.empty(0)

    @staticmethod
    def without_pads(meta: ForwardMetadata, decay: Tensor, beta: Tensor, dim: int) -> tuple[Tensor, Tensor]:
        """A delta rule's log-decay and write strength with pad tokens (token axis `dim`) zeroed: no decay and
        no write, so the state after them is the state after the last real token."""
        if meta.real_tokens is None:
            return decay, beta

        def keep(x: Tensor) -> Tensor:
            shape = [1] * x.dim()
            shape[dim] = -1
            return meta.real_tokens.view(shape)

        return torch.where(keep(decay), decay, 0.0), torch.where(keep(beta), beta, 0.0)

    def write_exports(self, meta: ForwardMetadata, conv: Tensor, ssm: Tensor) -> None:
        """Store states exported from inside the span into their destination slots."""
        if meta.num_exports:
            self.conv_state[meta.export_slots] = conv.to(self.conv_state.dtype)
            self.ssm_state[meta.export_slots] = ssm.to(self.ssm_state.dtype)


def untied_lm_head(spec: ModelSpec) -> nn.Linear | None:
    """The LM head of a family whose checkpoints may tie it: None when the embeddings are tied (the
    checkpoint has no lm_head; `HybridForCausalLM.output_weight` then reads embed_tokens.weight)."""
    return None if spec.tie_word_embeddings else nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)


class HybridForCausalLM(nn.Module):
    spec: ModelSpec

    def forward(self, input_ids: Tensor, meta: ForwardMetadata) -> Tensor:
        """input_ids: [T] flat new tokens of the batch → hidden states [T, hidden]."""
        raise NotImplementedError

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden: [..., hidden] → logits [..., vocab] (fp32)."""
        raise NotImplementedError

    def output_weight(self) -> Tensor:
        """[vocab, hidden]: the LM head's weight, or the input embedding's when they are tied."""
        lm_head = getattr(self, "lm_head", None)
        return self.model.embed_tokens.weight if lm_head is None else lm_head.weight

    def post_load(self) -> None:
        """Recompute non-persistent buffers (rotary tables…) after weights were loaded onto a real device."""

    def from_checkpoint(self, name: str, tensor: Tensor) -> Tensor:
        """Checkpoint tensor `name` (module-tree name; this rank's share under tensor parallelism) in the
        layout its parameter holds: identity, unless a family re-orders some rows at load so that its
        forward splits one GEMM's output into contiguous blocks (shape and name stay the checkpoint's)."""
        return tensor

    def checkpoint_name(self, name: str) -> str:
        """The module-tree name of checkpoint tensor `name`: identity, unless a family's checkpoints spell
        some names in more than one way."""
        return name

    def attention_mixers(self) -> list[AttentionMixer]:
        return [m for m in self.modules() if isinstance(m, AttentionMixer)]

    def linear_mixers(self) -> list[LinearMixer]:
        return [m for m in self.modules() if isinstance(m, LinearMixer)]

    def bind_caches(self, kv: list[tuple[Tensor, Tensor]], states: list[tuple[Tensor, Tensor]]) -> None:
        attn, lin = self.attention_mixers(), self.linear_mixers()
        if len(kv) != len(attn) or len(states) != len(lin):
            raise ValueError(
                f"model has {len(attn)} attention and {len(lin)} linear layers; "
                f"got {len(kv)} KV and {len(states)} state tensors"
            )
        for m, (k, v) in zip(attn, kv, strict=True):
            m.k_cache, m.v_cache = k, v
        for m, (conv, ssm) in zip(lin, states, strict=True):
            m.conv_state, m.ssm_state = conv, ssm
