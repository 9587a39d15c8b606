"""Command-line flags → EngineConfig. Each flag's `dest` is the EngineConfig field it sets, so a flag lands
in the config exactly once (`config_from_args`). Names follow `vllm serve` where the meaning is the same;
sizes accept vLLM's human-readable forms (`32k` = 32000, `32K` = 32768, `1.5G`, `8Gi`)."""

from __future__ import annotations

import argparse
import dataclasses
import re

from flashstate.config import CACHE_POLICIES, EVICTIONS, PREFILL_ORDERS, EngineConfig

_DTYPE_ALIASES = {"half": "float16", "float": "float32"}
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(i?)[bB]?\s*$")


def human_readable_int(value: str) -> int:
    """'2048' → 2048, '32k' → 32000, '32K' or '32Ki' → 32768, '1.5G' → 1610612736 (vLLM's convention:
    lower case is decimal, upper case or an `i` is binary)."""
    m = _SIZE.match(value)
    if m is None:
        raise argparse.ArgumentTypeError(f"not an integer size: {value!r}")
    number, unit, binary = m.groups()
    scale = _BINARY[unit.upper()] if (unit.isupper() or binary) and unit else _DECIMAL[unit.lower()]
    result = float(number) * scale
    if result != int(result):
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number")
    return int(result)


def _dtype(value: str) -> str:
    return _DTYPE_ALIASES.get(value, value)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Model, memory and batching flags (every subcommand that runs the engine)."""
    d = EngineConfig()
    g = p.add_argument_group("engine")
    g.add_argument(
        "--model", default=None, help="HF-format model directory (default: the embedded tiny model)"
    )
    g.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    g.add_argument(
        "--dtype",
        type=_dtype,
        default=d.dtype,
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weight and activation dtype (auto: the checkpoint's; half and float are accepted aliases)",
    )
    g.add_argument("--device", default=d.device, help="auto, cpu or cuda[:N] (auto: cuda when present)")
    g.add_argument("--seed", type=int, default=d.seed, help="global random seed")
    g.add_argument(
        "--max-model-len",
        type=human_readable_int,
        default=None,
        help="longest prompt + output in tokens (default: the model's max_position_embeddings)",
    )
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="most requests running at once")
    g.add_argument(
        "--max-num-batched-tokens",
        type=human_readable_int,
        default=d.max_num_batched_tokens,
        help="token budget of one step (prefill chunks + decodes)",
    )
    g.add_argument(
        "--long-prefill-token-threshold",
        type=human_readable_int,
        default=d.long_prefill_token_threshold,
        help="a request with more prompt tokens left than this prefills at most this many a step, "
        "leaving the budget to shorter ones (0: off)",
    )
    g.add_argument(
        "--prefill-order",
        choices=PREFILL_ORDERS,
        default=d.prefill_order,
        help="fifo (vLLM's): running requests' prefill chunks before admitting new ones; arrivals-first: "
        "decodes, then admissions, then running prefills shortest remaining first with the budget left, so a "
        "long prefill never holds arrivals or short prefills back (default: arrivals-first for "
        "--cache-policy flashstate, else fifo)",
    )
    g.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
    g.add_argument(
        "--kv-cache-memory-bytes",
        type=human_readable_int,
        default=None,
        help="bytes for KV blocks + state slots (default: from --gpu-memory-utilization on GPU, "
        "--cpu-cache-memory-bytes on CPU)",
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=d.gpu_memory_utilization,
        help="fraction of GPU memory the engine may use",
    )
    g.add_argument(
        "--cpu-cache-memory-bytes",
        type=human_readable_int,
        default=d.cpu_cache_memory_bytes,
        help="cache budget on CPU when --kv-cache-memory-bytes is unset",
    )
    g.add_argument(
        "--state-cache-fraction",
        type=float,
        default=d.state_cache_fraction,
        help="a fixed share of the cache budget for checkpoint slots (default: the policy's own: flashstate "
        "draws KV blocks and checkpoints from one shared budget, sglang holds back 0.25)",
    )
    g.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=d.tensor_parallel_size,
        help="GPUs to split the model's heads over (one process per GPU; on CPU, gloo processes)",
    )
    g.add_argument(
        "--enforce-eager",
        action="store_true",
        default=d.enforce_eager,
        help="run every step eagerly (no CUDA graphs: neither decode steps nor, unless --mixed-step-graphs, "
        "mixed steps)",
    )
    g.add_argument(
        "--mixed-step-graphs",
        action=argparse.BooleanOptionalAction,
        default=d.mixed_step_graphs,
        help="run a mixed step with up to 3 prefill chunks of up to 2,048 tokens in all padded to fixed "
        "shapes, replayed as a CUDA graph (default: on CUDA unless --enforce-eager; on the CPU the padded "
        "step runs eagerly, for tests)",
    )
    g.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=d.async_scheduling,
        help="prepare and launch the next decode step while the current one runs on the device",
    )
    g.add_argument(
        "--step-trace",
        metavar="PATH",
        default=d.step_trace,
        help="append one JSON line per engine step to PATH (start, duration, prefill tokens, decodes, queue)",
    )


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """Prefix cache and host tier flags (DESIGN.md §2–3)."""
    d = EngineConfig()
    g = p.add_argument_group("prefix cache")
    g.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=d.enable_prefix_caching,
        help="reuse the hybrid state of earlier prompts' prefixes",
    )
    g.add_argument(
        "--cache-policy",
        choices=CACHE_POLICIES,
        default=d.cache_policy,
        help="admission + eviction behaviour: flashstate (this project), vllm (align-mode blocks, LRU), "
        "sglang (MambaRadixCache), none",
    )
    g.add_argument(
        "--mamba-frontier-checkpoint",
        action=argparse.BooleanOptionalAction,
        default=d.mamba_frontier_checkpoint,
        help="checkpoint the hybrid state at each finished request's end",
    )
    g.add_argument(
        "--mamba-prefill-export",
        action=argparse.BooleanOptionalAction,
        default=d.mamba_prefill_export,
        help="export planned checkpoints (message ends, branch points) from inside prefill chunks",
    )
    g.add_argument(
        "--prefix-cache-eviction",
        choices=EVICTIONS,
        default=d.prefix_cache_eviction,
        help="eviction order: gds (prefill seconds saved per byte) or lru (default: the policy's own)",
    )
    g.add_argument(
        "--prefill-cost-coefficients",
        type=float,
        nargs=2,
        metavar=("A", "B"),
        default=d.prefill_cost_coefficients,
        help="prefill cost C(n) = A·n + B·n² seconds (default: calibrated on this hardware and model)",
    )
    g.add_argument(
        "--calibration-cache-dir",
        default=d.calibration_cache_dir,
        help="where calibrated coefficients are cached (default: ~/.cache/flashstate/calibration)",
    )
    g.add_argument(
        "--prefix-cache-leaf-last",
        action=argparse.BooleanOptionalAction,
        default=d.prefix_cache_leaf_last,
        help="evict the frontiers of recently active sessions last",
    )
    g.add_argument(
        "--prefix-cache-leaf-idle-seconds",
        type=float,
        default=d.prefix_cache_leaf_idle_seconds,
        help="a session frontier idle longer than this loses its protection",
    )
    g.add_argument(
        "--mamba-checkpoint-placement",
        choices=("asc", "aligned"),
        default=d.mamba_checkpoint_placement,
        help="flashstate policy: checkpoints at any position (asc) or only at vLLM's block boundaries "
        "(aligned: the last one inside each prompt and the junction; for ablations)",
    )
    g.add_argument(
        "--mamba-block-size",
        type=int,
        default=d.mamba_block_size,
        help="vllm policy: checkpoint block in tokens (default: derived as vLLM's align mode does)",
    )
    h = p.add_argument_group("host tier")
    h.add_argument(
        "--host-cache",
        choices=["memory", "mooncake"],
        default=d.host_cache,
        help="write finished hybrid states back to host memory: memory (embedded store) or mooncake "
        "(a Mooncake store; see --mooncake-master); default off",
    )
    h.add_argument(
        "--host-cache-bytes",
        type=human_readable_int,
        default=d.host_cache_bytes,
        help="host tier capacity in bytes; alone, turns on the memory tier (default with a tier: 4GiB; "
        "for mooncake, the memory this engine lends to the store's pool)",
    )
    h.add_argument(
        "--host-chunk-tokens",
        type=int,
        default=d.host_chunk_tokens,
        help="tokens of KV per shared chunk object in the host tier, rounded down to whole blocks (default "
        f"{d.host_chunk_tokens}); larger: fewer objects per restore, less sharing between branching states",
    )
    h.add_argument(
        "--host-inline-fetch",
        action=argparse.BooleanOptionalAction,
        default=d.host_inline_fetch,
        help="read and verify a restore from the in-process store on the engine thread when the request is "
        "admitted, so it runs in that very step rather than the next (default on; no effect on the mooncake "
        "store)",
    )
    h.add_argument(
        "--host-cache-timeout",
        type=float,
        default=d.host_cache_timeout,
        metavar="SECONDS",
        help="deadline of any one host-store call (default %(default)s): past it the store counts as down, "
        "serving goes on from the GPU cache and the store is probed in the background until it answers",
    )
    h.add_argument(
        "--host-cache-secret-file",
        default=d.host_cache_secret_file,
        metavar="PATH",
        help="deployment secret: every host-tier object carries an HMAC-SHA256 under it, and one that does "
        "not verify is a miss (default: env FLASHSTATE_HOST_CACHE_SECRET; without either, a shared store "
        "must be on a trusted network)",
    )
    h.add_argument(
        "--mooncake-master",
        default=d.mooncake_master,
        metavar="HOST:PORT",
        help="address of a running mooncake_master (with --host-cache mooncake)",
    )


def add_server_args(p: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    g = p.add_argument_group("server")
    g.add_argument("--host", default=d.host, help="address to bind")
    g.add_argument("--port", type=int, default=d.port, help="port to bind")
    g.add_argument(
        "--served-model-name",
        default=d.served_model_name,
        help="model name in the API (default: the --model path, or flashstate-tiny for the default)",
    )
    g.add_argument(
        "--api-key",
        nargs="+",
        default=d.api_key,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1/*, KEY any of those given (default: the "
        "FLASHSTATE_API_KEY or VLLM_API_KEY environment variable, else no key)",
    )
    g.add_argument(
        "--api-key-cache-isolation",
        action="store_true",
        default=d.api_key_cache_isolation,
        help="each API key is a cache tenant: a request's prefix-cache hits (GPU and host tier) come only "
        "from requests made with the same key (and cache_salt), whatever salt the client sends",
    )
    g.add_argument(
        "--engine-stall-seconds",
        type=float,
        default=d.engine_stall_seconds,
        help="/health answers 503 while the engine has had work and finished no step for this long",
    )
    g.add_argument(
        "--max-waiting-requests",
        type=int,
        default=d.max_waiting_requests,
        help="requests queued beyond this get 503",
    )
    g.add_argument(
        "--gil-switch-interval-ms",
        type=float,
        default=d.gil_switch_interval_ms,
        help="Python's GIL switch interval in the server: how long a thread that gave up the GIL (the "
        "event loop, a host-tier fetch) may wait for the busy engine thread to hand it back (Python: 5)",
    )
    g.add_argument(
        "--max-request-body-bytes",
        type=human_readable_int,
        default=d.max_request_body_bytes,
        help="larger request bodies get 413",
    )


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Every parsed flag whose dest names an EngineConfig field; raises ValueError for a bad value."""
    values = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig) if hasattr(args, f.name)
    }
    if isinstance(values.get("api_key"), list):
        values["api_key"] = tuple(values["api_key"])
    if values.get("prefill_cost_coefficients") is not None:
        values["prefill_cost_coefficients"] = tuple(values["prefill_cost_coefficients"])
    return EngineConfig(**values)
