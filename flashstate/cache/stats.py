"""Counters of the prefix cache, read by the server's /metrics and the bench report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class CacheStats:
    queries: int = 0  # requests looked up in the prefix cache
    hits: int = 0  # requests that restored a hybrid state
    query_tokens: int = 0  # prompt tokens looked up
    cached_tokens: int = 0  # prompt tokens restored (hit depth)
    uncached_tokens: int = 0  # prompt tokens prefilled
    admissions_refused: int = 0  # checkpoints the policy declined to keep
    evictions: Counter[str] = field(default_factory=Counter)  # reason → count
    checkpoints: int = 0  # held now
    checkpoint_bytes: int = 0  # state bytes held now (KV bytes are counted in blocks)
    host_hits: int = 0  # restores from the host tier
