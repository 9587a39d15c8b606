"""EngineConfig: every engine flag, once. Frozen; derived runtime numbers live on the objects that compute
them (CachePlan, Scheduler)."""

from __future__ import annotations

from dataclasses import dataclass

_DTYPES = ("auto", "float32", "bfloat16", "float16")
CACHE_POLICIES = ("flashstate", "vllm", "sglang", "none")
EVICTIONS = ("gds", "lru")
HOST_CACHES = (None, "memory", "mooncake")


PREFILL_ORDERS = ("fifo", "arrivals-first")


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
    long_prefill_token_threshold: int = 0  # a longer prefill takes at most this many tokens a step (0: off)
    # "fifo" (vLLM's): running sequences' chunks, then admissions; "arrivals-first": decodes, admissions, then
    # running prefills, shortest remaining first, with the budget left. None: arrivals-first for the
    # flashstate policy, fifo for the policies that stand for other engines.
    prefill_order: str | None = None
    block_size: int = 16
    kv_cache_memory_bytes: int | None = None  # KV + state budget; default from gpu_memory_utilization
    gpu_memory_utilization: float = 0.9
    cpu_cache_memory_bytes: int = 512 << 20  # budget on CPU when kv_cache_memory_bytes is unset
    # Share of the budget held back for checkpoint slots (a fixed split). None: the policy's own — flashstate
    # draws KV blocks and checkpoints from one byte budget, sglang splits 0.25 (SGLang's separate state pool).
    state_cache_fraction: float | None = None
    enable_prefix_caching: bool = True
    # Prefix cache (DESIGN.md §2–3).
    cache_policy: str = "flashstate"  # flashstate | vllm | sglang | none
    mamba_frontier_checkpoint: bool = True  # checkpoint the hybrid state at each request's end
    mamba_prefill_export: bool = True  # export planned checkpoints from inside prefill chunks
    prefix_cache_eviction: str | None = None  # gds | lru; None: the policy's own (flashstate: gds)
    prefill_cost_coefficients: tuple[float, float] | None = None  # C(n) = a·n + b·n²; None: calibrate
    calibration_cache_dir: str | None = None  # default ~/.cache/flashstate/calibration
    prefix_cache_leaf_last: bool = True  # protect recently active session frontiers
    prefix_cache_leaf_idle_seconds: float = 60.0
    mamba_block_size: int | None = None  # vllm policy: checkpoint block; None: derived like vLLM
    # flashstate policy: asc (any position) | aligned (vLLM's block-aligned placement, for ablations)
    mamba_checkpoint_placement: str = "asc"
    # Host tier (DESIGN.md §2.3): None (off) | memory (embedded store) | mooncake (mooncake_master store).
    host_cache: str | None = None
    host_cache_bytes: int | None = None  # host tier capacity (alone: turns the memory tier on); None: 4 GiB
    # tokens of KV per shared chunk object (rounded down to whole blocks, at least one): fewer, larger objects
    # make a restore fewer store reads and checksums; smaller ones share more between branching states
    host_chunk_tokens: int = 1024
    mooncake_master: str | None = None  # HOST:PORT of a running mooncake_master (host_cache="mooncake")
    # the in-process store's restores are read and verified on the engine thread at admission, and the
    # sequence joins the step that admits it (a step sooner); no effect on Mooncake's, read in the background
    host_inline_fetch: bool = True
    # seconds any one host-store call may take (Mooncake): past it the store counts as down (an outage, probed
    # in the background), so a hung master stalls the engine thread at most this long once per outage
    host_cache_timeout: float = 5.0
    # a file holding the deployment secret: every host object carries a MAC under it, and one that does not
    # verify is a miss (env FLASHSTATE_HOST_CACHE_SECRET when unset); without one, trust the store's network
    host_cache_secret_file: str | None = None
    # Server.
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    # keys any of which /v1/* accept (a str is one key); None: no key
    api_key: tuple[str, ...] | str | None = None
    # each API key's requests are a cache tenant: their prefix-cache hits (GPU and host) only come from
    # requests made with the same key (and the same cache_salt, if they send one)
    api_key_cache_isolation: bool = False
    max_waiting_requests: int = 1024  # beyond this the server answers 503
    # /health answers 503 while the engine thread has had work and no finished step for this long
    engine_stall_seconds: float = 60.0
    # Python's GIL switch interval in the server (Python's default is 5 ms): a thread that released the GIL
    # (the event loop after a socket write, a host-tier fetch after a checksum) waits up to this long for the
    # engine thread to give it back.
    gil_switch_interval_ms: float = 1.0
    tensor_parallel_size: int = 1  # ranks (GPUs: cuda:k..k+N-1) the model's heads are split over
    enforce_eager: bool = False  # no CUDA graphs (decode steps, and mixed steps unless asked for)
    # a mixed step with a few short chunks runs padded, as a CUDA graph (None: where decode steps are graphed)
    mixed_step_graphs: bool | None = None
    # Pure-decode steps: launch step n+1 before reading step n's tokens (the engine falls back to synchronous
    # steps whenever that could change what is computed: stop strings, admissions, preemption...).
    async_scheduling: bool = True
    step_trace: str | None = None  # a file that gets one JSON line per engine step
    max_request_body_bytes: int = 32 << 20  # larger request bodies get 413

    @property
    def prefix_caching(self) -> bool:
        return self.enable_prefix_caching and self.cache_policy != "none"

    @property
    def host_tier(self) -> str | None:
        """The host store in use: host_cache, else memory when host_cache_bytes is set, else None (off)."""
        if self.host_cache is None and self.host_cache_bytes is not None:
            return "memory"
        return self.host_cache

    @property
    def host_inline(self) -> bool:
        """Restores fetched inline at admission: asked for, and the store is the in-process one."""
        return self.host_inline_fetch and self.host_tier == "memory"

    def graphs_mixed_steps(self, graphs: bool) -> bool:
        """Whether small mixed steps run as CUDA graphs: `mixed_step_graphs` when set, else wherever decode
        steps are graphed (`graphs`: the device has CUDA graphs) and `enforce_eager` is off."""
        if self.mixed_step_graphs is not None:
            return self.mixed_step_graphs
        return graphs and not self.enforce_eager

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
        if not 0 < self.gil_switch_interval_ms <= 1000:
            raise ValueError(
                f"gil_switch_interval_ms must be in (0, 1000], got {self.gil_switch_interval_ms}"
            )
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}"
            )
        if self.prefill_order not in (None, *PREFILL_ORDERS):
            raise ValueError(
                f"prefill_order must be one of {', '.join(PREFILL_ORDERS)}, got {self.prefill_order!r}"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.cache_policy not in CACHE_POLICIES:
            raise ValueError(
                f"cache_policy must be one of {', '.join(CACHE_POLICIES)}, got {self.cache_policy!r}"
            )
        if self.prefix_cache_eviction is not None and self.prefix_cache_eviction not in EVICTIONS:
            raise ValueError(
                f"prefix_cache_eviction must be one of {', '.join(EVICTIONS)}, "
                f"got {self.prefix_cache_eviction!r}"
            )
        if self.mamba_checkpoint_placement not in ("asc", "aligned"):
            raise ValueError(
                f"mamba_checkpoint_placement must be asc or aligned, got {self.mamba_checkpoint_placement!r}"
            )
        if self.mamba_checkpoint_placement == "aligned" and self.cache_policy != "flashstate":
            raise ValueError("mamba_checkpoint_placement aligned is for the flashstate policy")
        if self.cache_policy == "vllm" and self.prefix_cache_eviction == "gds":
            raise ValueError("the vllm policy evicts as vLLM does (LRU over its page pool): no gds")
        if self.prefill_cost_coefficients is not None and (
            len(self.prefill_cost_coefficients) != 2 or min(self.prefill_cost_coefficients) < 0
        ):
            raise ValueError("prefill_cost_coefficients must be two non-negative numbers A B")
        if self.prefix_cache_leaf_idle_seconds < 0:
            raise ValueError("prefix_cache_leaf_idle_seconds must be >= 0")
        for name in (
            "mamba_block_size",
            "max_waiting_requests",
            "tensor_parallel_size",
            "host_cache_bytes",
            "host_chunk_tokens",
            "max_request_body_bytes",
        ):
            positive(name)
        self._check_host_tier()
        if isinstance(self.api_key, str):
            object.__setattr__(self, "api_key", (self.api_key,))
        if self.api_key is not None and (not self.api_key or not all(self.api_key)):
            raise ValueError("api_key must be one or more non-empty keys")
        if self.api_key_cache_isolation and self.api_key is None:
            raise ValueError("api_key_cache_isolation needs api_key (the tenants are the keys)")
        if not self.engine_stall_seconds > 0:
            raise ValueError(f"engine_stall_seconds must be > 0, got {self.engine_stall_seconds}")
        if self.host_tier is not None and self.tensor_parallel_size > 1:
            raise ValueError("host_cache needs tensor_parallel_size 1 (the host tier reads rank 0's pools)")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.state_cache_fraction is not None and not 0 <= self.state_cache_fraction < 1:
            raise ValueError(f"state_cache_fraction must be in [0, 1), got {self.state_cache_fraction}")

    def _check_host_tier(self) -> None:
        if self.host_cache not in HOST_CACHES:
            raise ValueError(f"host_cache must be memory, mooncake or None, got {self.host_cache!r}")
        if self.host_tier is not None and not self.prefix_caching:
            raise ValueError("the host tier (host_cache, host_cache_bytes) needs prefix caching on")
        if self.host_tier is not None and self.cache_policy == "vllm":
            raise ValueError(
                "the host tier is not part of the vllm policy (it reproduces vLLM's GPU prefix cache alone)"
            )
        if not self.host_cache_timeout > 0:
            raise ValueError(f"host_cache_timeout must be > 0 seconds, got {self.host_cache_timeout}")
        if self.host_cache == "mooncake" and self.mooncake_master is None:
            raise ValueError("host_cache='mooncake' needs mooncake_master HOST:PORT")
        if self.mooncake_master is None:
            return
        if self.host_cache != "mooncake":
            raise ValueError("mooncake_master needs host_cache='mooncake'")
        host, _, port = self.mooncake_master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"mooncake_master must be HOST:PORT, got {self.mooncake_master!r}")
