"""EngineConfig: every engine flag, once. Frozen; derived runtime numbers live on the objects that compute
them (CachePlan, Scheduler)."""

from __future__ import annotations

from dataclasses import dataclass

_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str | None = None  # HF-format directory; None: the embedded default
    tokenizer: str | None = None  # default: the model directory
    dtype: str = "auto"  # auto: the checkpoint's dtype
    device: str = "auto"  # auto: cuda when available, else cpu
    seed: int = 0
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_memory_bytes: int | None = None  # KV + state budget; default from gpu_memory_utilization
    gpu_memory_utilization: float = 0.9
    cpu_cache_memory_bytes: int = 512 << 20  # budget on CPU when kv_cache_memory_bytes is unset
    state_cache_fraction: float = 0.25  # share of the budget for checkpoint slots (prefix caching on)
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")

        for name in (
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
            "kv_cache_memory_bytes",
            "cpu_cache_memory_bytes",
        ):
            positive(name)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not 0 <= self.state_cache_fraction < 1:
            raise ValueError(f"state_cache_fraction must be in [0, 1), got {self.state_cache_fraction}")
