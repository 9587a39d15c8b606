"""q/k RMSNorm, rotary and the KV-cache write as the separate torch forms (the oracle)."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.attention.naive import store_kv
from flashstate.ops.norm.naive import rms_norm
from flashstate.ops.rotary.naive import apply_rotary_


def qk_norm_rope_store(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    *,
    eps: float,
    offset: float,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
) -> Tensor:
    """q: [T, H, D]; k: [T, Hk, D]; v: [T, Hk, Dv] (rows and heads may be strided); cos, sin: [T, R].
    q and k are normalised per head, then rotated on their first R dims (NeoX halves); k and v go to the
    paged caches ([blocks, block_size, Hk, ·]) at `slot_mapping`. Returns the prepared q (contiguous)."""
    q = apply_rotary_(rms_norm(q, q_weight, eps, offset), cos, sin)
    k = apply_rotary_(rms_norm(k, k_weight, eps, offset), cos, sin)
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q
