"""FLA's identity-keyed memo of index helpers, and CUDA graph capture."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def fla_tensor_cache_off() -> Iterator[None]:
    """FLA memoizes index helpers (chunk offsets, lengths) by the identity of their `cu_seqlens` argument.
    A graph captured while that cache holds an entry from an eager run replays reading the cached tensor,
    which the graph does not own: once FLA drops it, its memory is reused and the replay reads garbage. Off
    while warming up and capturing, every helper runs inside the graph, on the graph's own memory."""
    try:  # imported here: graphs are captured before the first prefill imports FLA, and warm-ups fill it
        import fla.utils as fla_utils
    except ImportError:  # no FLA (CPU kernels): nothing is cached
        yield
        return
    before = fla_utils.FLA_DISABLE_TENSOR_CACHE
    fla_utils.FLA_DISABLE_TENSOR_CACHE = True
    try:
        yield
    finally:
        fla_utils.FLA_DISABLE_TENSOR_CACHE = before
