"""EngineConfig: every engine setting, once. Frozen; derived runtime numbers live on the objects that compute
them (CachePlan, Scheduler). Each field made by `flag` is also the command-line flag `--field-name` (args.py
builds the parser from these fields): its help, group, default and, through the annotation, its type and
choices (a `Literal`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
CachePolicy = Literal["flashstate", "vllm", "sglang", "none"]
Eviction = Literal["gds", "lru"]
HostCache = Literal["memory", "mooncake"]
PrefillOrder = Literal["fifo", "arrivals-first"]
SchedulingPolicy = Literal["fcfs", "priority"]
PreemptionMode = Literal["recompute", "checkpoint"]
UvicornLogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
CheckpointPlacement = Literal["asc", "aligned"]
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]  # vLLM's names; fp8 is fp8_e4m3
LoadFormat = Literal["auto", "safetensors", "dummy"]  # vLLM's names; auto and safetensors read the same files
Quantization = Literal["fp8"]  # vLLM's name: block-wise FP8 weights (spec/quantization.py)
FallbackCheckpoints = Literal["off", "retry", "sparse", "auto"]

CACHE_POLICIES: tuple[str, ...] = get_args(CachePolicy)

# The names of the server's parser registries (server/tool_parsers/, server/reasoning.py), kept here as
# plain names so the config needs no server code; tests/server/test_tool_calling.py checks they agree.
ToolCallParser = Literal["hermes", "qwen3_coder", "qwen3_xml", "nemotron_v3", "kimi_k2", "nemotron_json"]
ReasoningParserName = Literal["qwen3", "deepseek_r1", "nemotron_v3", "nano_v3", "kimi_k2"]

INTERNAL = {
    "internal": True
}  # metadata of a field that is not a flag: `field(default=..., metadata=INTERNAL)`


def flag(
    default: Any,
    help: str,
    *,
    group: str,
    shown: str | None = None,
    metavar: str | tuple[str, ...] | None = None,
    aliases: tuple[str, ...] = (),
    size: bool = False,
    value_aliases: dict[str, str] | None = None,
) -> Any:
    """A field that is the flag `--field-name` too. `group`: its argparse group; `shown`: what --help says
    the default is, where the value alone says too little (what None stands for); `aliases`: more option
    strings; `size`: an int that takes vLLM's human-readable forms (`32k`, `8Gi`); `value_aliases`: other
    spellings of a choice."""
    metadata = {"help": help, "group": group, "shown": shown, "metavar": metavar, "aliases": aliases}
    metadata |= {"size": size, "value_aliases": value_aliases or {}}
    return field(default=default, metadata=metadata)


_engine = partial(flag, group="engine")
_cache = partial(flag, group="prefix cache")  # DESIGN.md §2–3
_host = partial(flag, group="host tier")  # DESIGN.md §2.3
_server = partial(flag, group="server")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str | None = _engine(None, "HF-format model directory", shown="the embedded tiny model")
    tokenizer: str | None = _engine(None, "tokenizer directory", shown="the model directory")
    load_format: LoadFormat = _engine(
        "auto",
        "auto, safetensors: load --model's safetensors; dummy: read no weights, build the model on the "
        "device with random ones (HF's init, deterministic per --seed) from --model's config.json: a "
        "directory holding config.json (tokenizer files optional: else the embedded tokenizer) or a preset",
    )
    dtype: Dtype = _engine(
        "auto",
        "weight and activation dtype; auto: the checkpoint's; half and float are accepted aliases",
        value_aliases={"half": "float16", "float": "float32"},
    )
    kv_cache_dtype: KvCacheDtype = _engine(
        "auto",
        "attention KV cache dtype (MLA's latent cache too; recurrent states keep theirs): auto: the model "
        "dtype; fp8, fp8_e4m3: float8_e4m3fn; fp8_e5m2: float8_e5m2. Stored with scale 1.0, saturating at "
        "the format's largest value (±448 for e4m3); the same budget then holds about twice the tokens",
    )
    quantization: Quantization | None = _engine(
        None,
        "weight quantization: fp8: block-wise FP8 linear weights (128x128 blocks, float8_e4m3fn with fp32 "
        "scales, the published FP8 checkpoints' layout), a bf16 / fp32 checkpoint quantized at load",
        shown="the checkpoint's (its config.json quantization_config)",
    )
    device: str = _engine("auto", "auto (cuda when present), cpu or cuda[:N]")
    seed: int = _engine(0, "global random seed")
    max_model_len: int | None = _engine(
        None, "longest prompt + output in tokens", shown="the model's max_position_embeddings", size=True
    )
    max_num_seqs: int = _engine(64, "most requests running at once")
    max_num_batched_tokens: int = _engine(
        2048, "token budget of one step: prefill chunks + decodes", size=True
    )
    long_prefill_token_threshold: int = _engine(
        0,
        "a request with more prompt tokens left than this prefills at most this many a step, leaving the "
        "budget to shorter ones; 0: off",
        size=True,
    )
    prefill_order: PrefillOrder | None = _engine(
        None,
        "fifo (vLLM's): running requests' prefill chunks before admitting new ones; arrivals-first: decodes, "
        "then admissions, then running prefills shortest remaining first with the budget left, so a long "
        "prefill never holds arrivals or short prefills back",
        shown="arrivals-first for --cache-policy flashstate, else fifo",
    )
    scheduling_policy: SchedulingPolicy = _engine(
        "fcfs",
        "fcfs: requests wait in arrival order; priority: by their `priority` (lower first, vLLM's), then "
        "arrival, and a lower-priority running request is preempted first",
    )
    memory_admission: bool | None = _engine(
        None,
        "admit a request only when the running requests, grown to their expected lengths, fit beside "
        "--admission-cache-reserve of the cache; mostly-cached prompts first, aged ones never passed over",
        shown="on for --cache-policy flashstate; off (the baselines' schedulers) for vllm and sglang",
    )
    admission_expected_output_tokens: int = _engine(
        2048,
        "memory admission: the output length expected of a request (its max_tokens if smaller)",
        size=True,
    )
    admission_cache_reserve: float = _engine(
        0.25, "memory admission: the fraction of the cache the running requests leave to cached prefixes"
    )
    admission_cold_reserve: float = _engine(
        0.55,
        "memory admission: the fraction they leave when the request admitted is mostly uncached (the larger "
        "of this and --admission-cache-reserve; not for an aged request): a cold prompt's blocks are all new",
    )
    max_queue_wait_seconds: float = _engine(
        900.0,
        "memory admission: a request queued this long goes first and is never passed over (until then "
        "mostly-cached prompts go first: a smaller bound gives up more of the cache's hits under overload)",
    )
    preemption_mode: PreemptionMode | None = _engine(
        None,
        "recompute: a preempted request keeps nothing and resumes from its prefix hit; checkpoint: its "
        "state at the preemption point stays as a cache unit (priced like any other), which it resumes from",
        shown="checkpoint for --cache-policy flashstate, else recompute",
    )
    max_logprobs: int = _engine(20, "most logprobs (top_logprobs) a request may ask for per token")
    block_size: int = _engine(16, "tokens per KV block")
    kv_cache_memory_bytes: int | None = _engine(
        None,
        "bytes for KV blocks + state slots",
        shown="from --gpu-memory-utilization on GPU, --cpu-cache-memory-bytes on CPU",
        size=True,
    )
    gpu_memory_utilization: float = _engine(0.9, "fraction of GPU memory the engine may use")
    cpu_cache_memory_bytes: int = _engine(
        512 << 20, "cache budget on CPU when --kv-cache-memory-bytes is unset", size=True
    )
    state_cache_fraction: float | None = _engine(  # sglang's 0.25: SGLang's separate state pool
        None,
        "a fixed share of the cache budget for checkpoint slots",
        shown="the policy's own: flashstate draws KV blocks and checkpoints from one shared budget, sglang "
        "holds back 0.25",
    )
    reserve_working_slots: bool = _engine(
        False,
        "flashstate's shared budget, where --kv-cache-memory-bytes sets it: keep --max-num-seqs working "
        "state slots apart from it (the engine before 2026-12-05) instead of charging a request's working "
        "slot to it while the request holds one (idle slots then hold KV and checkpoints)",
    )
    tensor_parallel_size: int = _engine(  # ranks on cuda:k..k+N-1
        1,
        "GPUs to split the model's heads over (one process per GPU; on CPU, gloo processes)",
        aliases=("-tp",),
    )
    enforce_eager: bool = _engine(
        False,
        "run every step eagerly (no CUDA graphs: neither decode steps nor, unless --mixed-step-graphs, mixed "
        "steps)",
    )
    mixed_step_graphs: bool | None = _engine(
        None,
        "run a mixed step with up to 3 prefill chunks of up to 2,048 tokens in all padded to fixed shapes, "
        "replayed as a CUDA graph",
        shown="on CUDA unless --enforce-eager; on the CPU the padded step runs eagerly, for tests",
    )
    # The engine falls back to synchronous steps whenever that could change what is computed: stop strings,
    # admissions, preemption...
    async_scheduling: bool = _engine(
        True, "prepare and launch the next decode step while the current one runs on the device"
    )
    step_trace: str | None = _engine(
        None,
        "append one JSON line per engine step to PATH (start, duration, prefill tokens, decodes, queue)",
        metavar="PATH",
    )
    kernel_cache: str | None = _engine(
        None,
        "restore the Triton kernels compiled by an earlier start with the same Triton, torch, CUDA and GPU "
        "from DIR before building, and archive there what this start's warm-up compiled (a start without "
        "compiles: seconds, not minutes)",
        metavar="DIR",
    )

    enable_prefix_caching: bool = _cache(True, "reuse the hybrid state of earlier prompts' prefixes")
    cache_policy: CachePolicy = _cache(
        "flashstate",
        "admission + eviction behaviour: flashstate (this project), vllm (align-mode blocks, LRU), sglang "
        "(MambaRadixCache), none",
    )
    mamba_frontier_checkpoint: bool = _cache(
        True, "checkpoint the hybrid state at each finished request's end"
    )
    mamba_prefill_export: bool = _cache(
        True, "export planned checkpoints (message ends, branch points) from inside prefill chunks"
    )
    mamba_fallback_checkpoints: FallbackCheckpoints = _cache(
        "auto",
        "flashstate policy: checkpoints a request can fall back to when the next one leaves the frontier's "
        "path, priced by the same admission as the rest: off, retry (one token before each prompt's end: "
        "retries and edits inside the reply), sparse (retry, and every vLLM block boundary of a prefill), "
        "auto (retry, and the block boundaries while they fit without evicting anything, evicted first)",
    )
    prefix_cache_eviction: Eviction | None = _cache(
        None,
        "eviction order: gds (prefill seconds saved per byte) or lru",
        shown="the policy's own; flashstate: gds",
    )
    prefill_cost_coefficients: tuple[float, float] | None = _cache(
        None,
        "prefill cost C(n) = A·n + B·n² seconds",
        shown="calibrated on this hardware and model",
        metavar=("A", "B"),
    )
    calibration_cache_dir: str | None = _cache(
        None, "where calibrated coefficients are cached", shown="~/.cache/flashstate/calibration"
    )
    prefix_cache_leaf_last: bool = _cache(True, "evict the frontiers of recently active sessions last")
    prefix_cache_leaf_idle_seconds: float = _cache(
        60.0, "a session frontier idle longer than this loses its protection"
    )
    mamba_checkpoint_placement: CheckpointPlacement = _cache(
        "asc",
        "flashstate policy: checkpoints at any position (asc) or only at vLLM's block boundaries (aligned: "
        "the last one inside each prompt and the junction; for ablations)",
    )
    mamba_block_size: int | None = _cache(
        None, "vllm policy: checkpoint block in tokens", shown="derived as vLLM's align mode does"
    )

    host_cache: HostCache | None = _host(
        None,
        "write finished hybrid states back to host memory: memory (embedded store) or mooncake (a Mooncake "
        "store; see --mooncake-master)",
        shown="off",
    )
    host_cache_bytes: int | None = _host(
        None,
        "host tier capacity in bytes; alone, turns on the memory tier; for mooncake, the memory this engine "
        "lends to the store's pool",
        shown="4Gi with a tier",
        size=True,
    )
    host_chunk_tokens: int = _host(  # at least one block; fewer objects: fewer store reads and checksums
        1024,
        "tokens of KV per shared chunk object in the host tier, rounded down to whole blocks; larger: fewer "
        "objects per restore, less sharing between branching states",
    )
    host_inline_fetch: bool = _host(  # Mooncake's restores are read in the background
        True,
        "read and verify a restore from the in-process store on the engine thread when the request is "
        "admitted, so it runs in that very step rather than the next; no effect on the mooncake store",
    )
    host_prefetch: bool = _host(  # off: on the H200 it cost TPM and TTFT p90 (benchmarks/RESULTS.md)
        False,
        "read and verify a queued request's host hit in the background while it waits, so the step that "
        "admits it only copies the state in (one admitted while its read runs waits for the rest); the "
        "in-process store only (Mooncake's restores are read in the background anyway)",
    )
    host_cache_timeout: float = _host(  # a hung master stalls the engine thread this long once per outage
        5.0,
        "deadline of any one host-store call: past it the store counts as down, serving goes on from the GPU "
        "cache and the store is probed in the background until it answers",
        metavar="SECONDS",
    )
    host_cache_secret_file: str | None = _host(
        None,
        "deployment secret: every host-tier object carries an HMAC-SHA256 under it, and one that does not "
        "verify is a miss; without a secret, a shared store must be on a trusted network",
        shown="env FLASHSTATE_HOST_CACHE_SECRET",
        metavar="PATH",
    )
    mooncake_master: str | None = _host(
        None, "address of a running mooncake_master (with --host-cache mooncake)", metavar="HOST:PORT"
    )

    host: str = _server("127.0.0.1", "address to bind")
    port: int = _server(8000, "port to bind")
    served_model_name: str | None = _server(
        None, "model name in the API", shown="the --model path, or flashstate-tiny for the default"
    )
    api_key: tuple[str, ...] | str | None = _server(  # a str is one key
        None,
        "require 'Authorization: Bearer KEY' on /v1/*, KEY any of those given",
        shown="the FLASHSTATE_API_KEY or VLLM_API_KEY environment variable, else no key",
        metavar="KEY",
    )
    api_key_cache_isolation: bool = _server(
        False,
        "each API key is a cache tenant: a request's prefix-cache hits (GPU and host tier) come only from "
        "requests made with the same key (and cache_salt), whatever salt the client sends",
    )
    engine_stall_seconds: float = _server(
        60.0, "/health answers 503 while the engine has had work and finished no step for this long"
    )
    max_waiting_requests: int = _server(1024, "requests queued beyond this get 503")
    gil_switch_interval_ms: float = _server(
        1.0,
        "Python's GIL switch interval in the server: how long a thread that gave up the GIL (the event loop, "
        "a host-tier fetch) may wait for the busy engine thread to hand it back (Python: 5)",
    )
    max_request_body_bytes: int = _server(32 << 20, "larger request bodies get 413", size=True)
    enable_auto_tool_choice: bool = _server(
        False,
        "parse tool calls out of the output of requests with tools and tool_choice auto (needs "
        "--tool-call-parser); without it such requests get 400, as in vLLM",
    )
    tool_call_parser: ToolCallParser | None = _server(
        None, "the model's tool-call format (vLLM's parser names)", shown="none"
    )
    tool_parser_stream_arguments: bool = _server(
        True,
        "streamed tool calls: the name once complete, then the arguments as they are generated (vLLM's "
        "way; a client sees a long argument grow and no stream goes quiet while one is written); off: each "
        "call whole once it is complete and valid (a malformed call is content, never a broken call)",
    )
    reasoning_parser: ReasoningParserName | None = _server(
        None,
        "split the output into reasoning_content (and vLLM's `reasoning`) and content (vLLM's parser names)",
        shown="none",
    )
    chat_splice_bytes: int = _server(
        4 << 20,
        "chat prompts: an assistant message's content (or tool-call arguments) that this server generated "
        "is tokenized as the ids it generated, not re-encoded from text, so the next turn stays on the "
        "cached token path (server/prompt_splice.py); this many bytes of generated ids are remembered "
        "(LRU); 0: off",
        size=True,
    )
    chat_template: str | None = _server(
        None,
        "the chat template: a file, or the Jinja template itself (text with {, } or a newline)",
        shown="the tokenizer's",
        metavar="PATH_OR_TEMPLATE",
    )
    generation_config: str = _server(
        "auto",
        "default sampling settings of requests that leave them unset: auto (the model directory's "
        "generation_config.json: temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens as a "
        "cap on max_tokens), vllm (none: vLLM's own defaults), or a folder holding a generation_config.json",
        metavar="auto|vllm|FOLDER",
    )
    uvicorn_log_level: UvicornLogLevel = _server("info", "uvicorn's log level")
    allowed_origins: tuple[str, ...] = _server(("*",), "CORS: allowed origins", metavar="ORIGIN")
    allowed_methods: tuple[str, ...] = _server(("*",), "CORS: allowed methods", metavar="METHOD")
    allowed_headers: tuple[str, ...] = _server(("*",), "CORS: allowed headers", metavar="HEADER")
    allow_credentials: bool = _server(False, "CORS: allow credentials")
    enable_dev_endpoints: bool = _server(
        False,
        "serve the development endpoints (POST /reset_prefix_cache), as vLLM's VLLM_SERVER_DEV_MODE=1; also "
        "on with FLASHSTATE_SERVER_DEV_MODE=1 or VLLM_SERVER_DEV_MODE=1",
    )

    @property
    def prefix_caching(self) -> bool:
        return self.enable_prefix_caching and self.cache_policy != "none"

    @property
    def shared_cache_budget(self) -> bool:
        """KV blocks and checkpoints trade against one budget: the flashstate policy with prefix caching
        and no fixed state_cache_fraction split."""
        return self.prefix_caching and self.state_cache_fraction is None and self.cache_policy == "flashstate"

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
            "admission_expected_output_tokens",
            "block_size",
            "kv_cache_memory_bytes",
            "cpu_cache_memory_bytes",
        ):
            positive(name)
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be >= 0, got {self.max_logprobs}")
        if not 0 < self.gil_switch_interval_ms <= 1000:
            raise ValueError(
                f"gil_switch_interval_ms must be in (0, 1000], got {self.gil_switch_interval_ms}"
            )
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}"
            )
        if self.mamba_fallback_checkpoints not in get_args(FallbackCheckpoints):
            raise ValueError(
                "mamba_fallback_checkpoints must be off, retry, sparse or auto, "
                f"got {self.mamba_fallback_checkpoints!r}"
            )
        if self.mamba_checkpoint_placement not in get_args(CheckpointPlacement):
            raise ValueError(
                f"mamba_checkpoint_placement must be asc or aligned, got {self.mamba_checkpoint_placement!r}"
            )
        for name, values in FIELD_CHOICES.items():
            if getattr(self, name) not in values:
                choices = ", ".join(map(str, values))
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.mamba_checkpoint_placement == "aligned" and self.cache_policy != "flashstate":
            raise ValueError("mamba_checkpoint_placement aligned is for the flashstate policy")
        if self.cache_policy == "vllm" and self.prefix_cache_eviction == "gds":
            raise ValueError("the vllm policy evicts as vLLM does (LRU over its page pool): no gds")
        if self.prefill_cost_coefficients is not None and (
            len(self.prefill_cost_coefficients) != 2 or min(self.prefill_cost_coefficients) < 0
        ):
            raise ValueError("prefill_cost_coefficients must be two non-negative numbers A B")
        if not 0 <= self.admission_cache_reserve < 1:
            raise ValueError(f"admission_cache_reserve must be in [0, 1), got {self.admission_cache_reserve}")
        if not 0 <= self.admission_cold_reserve < 1:
            raise ValueError(f"admission_cold_reserve must be in [0, 1), got {self.admission_cold_reserve}")
        if not self.max_queue_wait_seconds >= 0:
            raise ValueError(f"max_queue_wait_seconds must be >= 0, got {self.max_queue_wait_seconds}")
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
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser (the model's tool-call format)")
        template = self.chat_template
        if template is not None and not _inline_template(template) and not os.path.isfile(template):
            raise ValueError(
                f"chat_template {template!r} is neither a file nor a template (a template holds {{, }} "
                "or a newline)"
            )

    def _check_host_tier(self) -> None:
        if self.host_tier is not None and not self.prefix_caching:
            raise ValueError("the host tier (host_cache, host_cache_bytes) needs prefix caching on")
        if self.host_tier is not None and self.cache_policy == "vllm":
            raise ValueError(
                "the host tier is not part of the vllm policy (it reproduces vLLM's GPU prefix cache alone)"
            )
        if not self.host_cache_timeout > 0:
            raise ValueError(f"host_cache_timeout must be > 0 seconds, got {self.host_cache_timeout}")
        if self.reserve_working_slots and not self.shared_cache_budget:
            raise ValueError(
                "reserve_working_slots: only the flashstate policy's shared budget charges working slots "
                "(prefix caching on, no state_cache_fraction)"
            )
        if self.host_prefetch and not self.host_inline:
            raise ValueError(
                "host_prefetch reads ahead what the in-process store would read at admission: it needs "
                "host_cache 'memory' (or host_cache_bytes alone) and host_inline_fetch"
            )
        if self.host_cache == "mooncake" and self.mooncake_master is None:
            raise ValueError("host_cache='mooncake' needs mooncake_master HOST:PORT")
        if self.mooncake_master is None:
            return
        if self.host_cache != "mooncake":
            raise ValueError("mooncake_master needs host_cache='mooncake'")
        host, _, port = self.mooncake_master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"mooncake_master must be HOST:PORT, got {self.mooncake_master!r}")


def _inline_template(value: str) -> bool:
    """A --chat-template value that is the template itself rather than a path (vLLM's rule)."""
    return any(c in value for c in "{}\n")


def _choices(hint: Any) -> tuple[Any, ...]:
    """A Literal annotation's values, None among them where the annotation allows it; () for any other."""
    arms = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    values = tuple(v for arm in arms if get_origin(arm) is Literal for v in get_args(arm))
    return (*values, None) if values and type(None) in arms else values


FIELD_CHOICES: dict[str, tuple[Any, ...]] = {
    name: values for name, hint in get_type_hints(EngineConfig).items() if (values := _choices(hint))
}
