"""What a value becomes in the KV cache (`store_kv` and every fused store): the cache's dtype. An fp8 cache
(`--kv-cache-dtype fp8`) holds K/V with scale 1.0, vLLM's default without calibrated scales: values are cast
with saturation to the format's largest finite value (±448 for float8_e4m3fn, ±57344 for float8_e5m2), so
an outlier becomes the largest value instead of NaN (e4m3fn has no infinity) or inf. Readers upcast to the
query's dtype."""

from __future__ import annotations

import torch
from torch import Tensor

FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_KV_DTYPES


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 cache dtype; 0.0 for any other dtype (no saturation)."""
    return float(torch.finfo(dtype).max) if is_fp8(dtype) else 0.0


def to_kv_cache(x: Tensor, dtype: torch.dtype) -> Tensor:
    """`x` as the cache stores it: cast to `dtype`, saturated for fp8 (NaN stays NaN)."""
    if is_fp8(dtype):
        m = fp8_max(dtype)
        return x.clamp(-m, m).to(dtype)
    return x.to(dtype)


def as_bytes(t: Tensor) -> Tensor:
    """An fp8 tensor as its uint8 bytes (same shape, a view), for copies torch has no float8 kernel for
    (index_copy_); any other tensor as it is."""
    return t.view(torch.uint8) if is_fp8(t.dtype) else t


def gather_blocks(cache: Tensor, table: Tensor) -> Tensor:
    """`cache[table]` (the blocks of one block table), fp8 ones gathered as their bytes: the gather then
    needs no float8 kernel on any device."""
    if is_fp8(cache.dtype):
        return cache.view(torch.uint8)[table].view(cache.dtype)
    return cache[table]
