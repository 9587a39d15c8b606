"""The device tensors behind the KV block pool and the state pool, bound into the model's layers.

    KV, per attention layer:  k [num_blocks, block_size, kv_heads, head_dim]
                              v [num_blocks, block_size, kv_heads, v_head_dim]     (kv dtype)
                              MLA: k [.., 1, kv_lora_rank + rope] (the latent), v a view of its first
                              kv_lora_rank values (AttentionSpec.cache_*)
    state, per linear layer:  conv [num_slots, conv_channels, conv_kernel - 1]      (model dtype)
                              ssm  [num_slots, *LinearSpec.state_shape]             (fp32)
The kv dtype is the model dtype, or fp8 with `--kv-cache-dtype fp8` (`kv_dtype`; stored with scale 1.0,
ops/attention/kv_cast.py): then a block takes half the bytes of bf16. States never change dtype.
A block id or slot id indexes the same row in every layer's tensor. One row past the pools' blocks and
slots (`pad_block`, `pad_slot`) belongs to no pool: padded rows of a CUDA-graph batch write there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flashstate.models.base import HybridForCausalLM
from flashstate.spec.model_spec import ModelSpec

STATE_DTYPE = torch.float32
# --kv-cache-dtype (vLLM's names) → the cache's torch dtype; "auto" is the model dtype
KV_CACHE_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def kv_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The attention cache's dtype for the flag's value `kv_cache_dtype`, on a model in `dtype`."""
    if kv_cache_dtype == "auto":
        return dtype
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype must be auto or one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}"
        )
    return KV_CACHE_DTYPES[kv_cache_dtype]


def kv_bytes_per_block(spec: ModelSpec, block_size: int, dtype: torch.dtype) -> int:
    """Every attention layer's K and V bytes of one block, the cache in `dtype` (the kv dtype: `kv_dtype`)."""
    a = spec.attention
    if a is None or not spec.attention_layer_ids:
        return 0
    values = a.cache_k_dim if a.latent_cache else a.cache_k_dim + a.cache_v_dim
    per_token = a.cache_kv_heads * values * dtype.itemsize
    return per_token * block_size * len(spec.attention_layer_ids)


def state_bytes_per_slot(spec: ModelSpec, dtype: torch.dtype) -> int:
    lin = spec.linear
    if lin is None or not spec.linear_layer_ids:
        return 0
    conv = lin.conv_channels * (lin.conv_kernel - 1) * dtype.itemsize
    ssm = STATE_DTYPE.itemsize
    for d in lin.state_shape:
        ssm *= d
    return (conv + ssm) * len(spec.linear_layer_ids)


def kv_tensors(kv: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
    """Every attention layer's K and V tensors, each memory once: MLA's V is a view into its K."""
    out = []
    for k, v in kv:
        out.append(k)
        if v.untyped_storage().data_ptr() != k.untyped_storage().data_ptr():
            out.append(v)
    return out


@dataclass(slots=True)
class CacheTensors:
    kv: list[tuple[Tensor, Tensor]]
    states: list[tuple[Tensor, Tensor]]
    pad_block: int
    pad_slot: int

    @classmethod
    def allocate(
        cls,
        spec: ModelSpec,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        kv_cache_dtype: torch.dtype | None = None,
    ) -> CacheTensors:
        """States in `dtype` (conv) and STATE_DTYPE (ssm); K/V in `kv_cache_dtype` (None: `dtype`)."""
        kv_cache_dtype = kv_cache_dtype or dtype
        kv, states = [], []
        a, lin = spec.attention, spec.linear
        pad_block, pad_slot = num_blocks, num_slots
        num_blocks, num_slots = num_blocks + 1, num_slots + 1
        for _ in spec.attention_layer_ids:
            shape = (num_blocks, block_size, a.cache_kv_heads)
            k = torch.zeros(*shape, a.cache_k_dim, dtype=kv_cache_dtype, device=device)
            if a.latent_cache:
                v = k[..., : a.cache_v_dim]
            else:
                v = torch.zeros(*shape, a.cache_v_dim, dtype=kv_cache_dtype, device=device)
            kv.append((k, v))
        for _ in spec.linear_layer_ids:
            states.append(
                (
                    torch.zeros(num_slots, *lin.conv_state_shape, dtype=dtype, device=device),
                    torch.zeros(num_slots, *lin.state_shape, dtype=STATE_DTYPE, device=device),
                )
            )
        return cls(kv, states, pad_block, pad_slot)

    def bind(self, model: HybridForCausalLM) -> None:
        model.bind_caches(self.kv, self.states)

    def copy_slot(self, src: int, dst: int) -> None:
        """Copy every linear layer's state from slot `src` to slot `dst`."""
        for conv, ssm in self.states:
            conv[dst].copy_(conv[src])
            ssm[dst].copy_(ssm[src])

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one KV block in every attention layer (copy-on-write of a partially filled block)."""
        for t in kv_tensors(self.kv):
            t[dst].copy_(t[src])
