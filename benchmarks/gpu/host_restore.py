"""Host tier on the GPU: host ↔ device bandwidth (pinned and pageable), and the time to restore a long
hybrid state (KV of every attention layer + the linear layers' checkpoint) from the embedded host store
versus prefilling the same tokens, through the engine.

    PYTHONPATH=. python benchmarks/gpu/host_restore.py                  # qwen3-next-2b, 100k tokens, cuda
    PYTHONPATH=. python benchmarks/gpu/host_restore.py --device cpu --tokens 2000   # CPU fallback: tiny
    PYTHONPATH=. python benchmarks/gpu/host_restore.py --tokens 25000 --crc zlib --host-chunk-tokens 4096

Steps: a prompt of N tokens is prefilled (cold TTFT, max_tokens = 1), its state is written back
(the write-back time is reported, though requests never wait for it), the GPU-side cache is emptied,
and the same prompt + 1 token is sent again: it restores N tokens from the host tier (timed: read +
verify, and host → device copies) and prefills one. Prints a table last; writes $OUT/host_restore.json
when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch

from flashstate.spec.hf_config import spec_from_hf


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bandwidth(device: torch.device, nbytes: int, repeats: int = 5) -> dict[str, float]:
    """GB/s of host → device and device → host copies, pinned and pageable host memory."""
    out = {}
    pin = device.type == "cuda"
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for name, host in (("pinned", torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)),
                       ("pageable", torch.empty(nbytes, dtype=torch.uint8))):  # fmt: skip
        if name == "pinned" and not pin:
            continue
        for direction, (dst, src) in (("h2d", (dev, host)), ("d2h", (host, dev))):
            dst.copy_(src, non_blocking=True)
            sync(device)
            start = time.perf_counter()
            for _ in range(repeats):
                dst.copy_(src, non_blocking=True)
            sync(device)
            out[f"{direction}_{name}_gb_per_s"] = repeats * nbytes / (time.perf_counter() - start) / 1e9
    return out


class Timer:
    """Wraps a method and adds up its wall time (device synchronised)."""

    def __init__(self, obj: object, name: str, device: torch.device):
        self.total = 0.0
        self.calls = 0
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            sync(device)
            start = time.perf_counter()
            result = inner(*args, **kwargs)
            sync(device)
            self.total += time.perf_counter() - start
            self.calls += 1
            return result

        setattr(obj, name, timed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--preset", default=None, help="model preset (default: qwen3-next-2b on cuda, tiny on cpu)"
    )
    p.add_argument("--tokens", type=int, default=100_000)
    p.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens of the prefill")
    p.add_argument("--bandwidth-bytes", type=int, default=1 << 30)
    p.add_argument(
        "--host-chunk-tokens", type=int, default=None, help="the tier's chunk objects (default: the engine's)"
    )
    p.add_argument(
        "--crc",
        choices=("default", "zlib"),
        default="default",
        help="the objects' CRC-32: the codec's (ISA-L where installed), or zlib's (the value is the same)",
    )
    a = p.parse_args()
    if a.crc == "zlib":  # the codec's choice at import, overridden for a before/after
        import zlib

        from flashstate.cache.host import codec

        codec.crc32 = zlib.crc32
    device = torch.device(a.device)
    preset = a.preset or ("qwen3-next-2b" if device.type == "cuda" else "tiny")

    from flashstate import LLM, SamplingParams
    from flashstate.cache.cache_tensors import kv_bytes_per_block, state_bytes_per_slot
    from flashstate.models.presets import preset_dir

    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "preset": preset,
        "tokens": a.tokens,
        "crc": a.crc,
    }
    result.update(bandwidth(device, a.bandwidth_bytes if device.type == "cuda" else 64 << 20))

    model_dir = str(preset_dir(preset))
    spec = spec_from_hf(model_dir)
    dtype = spec.dtype if device.type == "cuda" else torch.float32
    block = 16
    n = a.tokens
    kv_tokens = 2 * (n + a.chunk + 64)  # the cold run's blocks + the restored copy while both are alive
    budget = 4 * state_bytes_per_slot(spec, dtype) + kv_tokens // block * kv_bytes_per_block(
        spec, block, dtype
    )
    state_bytes = kv_bytes_per_block(spec, block, dtype) * -(-n // block) + state_bytes_per_slot(spec, dtype)
    llm = LLM(
        model_dir,
        device=a.device,
        dtype=str(dtype).removeprefix("torch."),
        max_model_len=n + 64,
        max_num_seqs=2,
        max_num_batched_tokens=a.chunk,
        block_size=block,
        kv_cache_memory_bytes=budget,
        state_cache_fraction=0.0,
        prefill_cost_coefficients=(1e-5, 1e-10),
        host_cache="memory",
        host_cache_bytes=int(state_bytes * 1.2) + (64 << 20),
        **({} if a.host_chunk_tokens is None else {"host_chunk_tokens": a.host_chunk_tokens}),
    )
    engine, host = llm.engine, llm.engine.host
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rng = random.Random(0)
    prompt = [rng.randrange(spec.vocab_size) for _ in range(n)]
    warm_up = [rng.randrange(spec.vocab_size) for _ in range(min(n, 512))]  # not a prefix of `prompt`
    llm.generate([warm_up], params)
    host.flush()
    engine.reset_prefix_cache()
    warm_up_bytes = host.used

    sync(device)
    start = time.perf_counter()
    cold = llm.generate([prompt], params)[0]
    sync(device)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    host.flush()
    write_back = time.perf_counter() - start
    engine.reset_prefix_cache()  # the GPU-side copy is gone: only the host tier holds the state

    fetch, load = Timer(host, "fetch", device), Timer(host, "load", device)
    sync(device)
    start = time.perf_counter()
    warm = llm.generate([prompt + cold.token_ids], params)[0]
    sync(device)
    restored_ttft = time.perf_counter() - start
    if cold.num_cached_tokens != 0 or warm.num_cached_tokens != n:
        raise SystemExit(
            f"expected 0 then {n} cached tokens, got {cold.num_cached_tokens}, {warm.num_cached_tokens}"
        )
    restore = fetch.total + load.total
    nbytes = host.used - warm_up_bytes  # the N-token state's objects
    result["host_chunk_tokens"] = host.layout.chunk_tokens
    result.update(
        {
            "state_bytes": nbytes,
            "prefill_seconds": prefill,
            "prefill_tokens_per_s": n / prefill,
            "write_back_flush_seconds": write_back,
            "restore_read_verify_seconds": fetch.total,
            "restore_copy_seconds": load.total,
            "restore_seconds": restore,
            "restore_gb_per_s": nbytes / restore / 1e9,
            "restore_copy_gb_per_s": nbytes / load.total / 1e9,
            "restored_request_seconds": restored_ttft,
            "prefill_over_restore": prefill / restore,
        }
    )
    engine.close()
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "host_restore.json"), "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    rows = [
        ("device", result["device"]),
        ("model / tokens / chunk / CRC", f"{preset} / {n} / {host.layout.chunk_tokens} / {a.crc}"),
        ("state size (KV + checkpoint)", f"{nbytes / 2**20:.1f} MiB"),
    ]
    rows += [
        (k.replace("_gb_per_s", " GB/s"), f"{v:.3g}") for k, v in result.items() if k.endswith("_gb_per_s")
    ]
    rows += [
        ("prefill N tokens (cold request)", f"{prefill:.3f} s ({n / prefill:,.0f} tok/s)"),
        ("restore from host: read + verify", f"{fetch.total:.3f} s"),
        ("restore from host: host → device copy", f"{load.total:.3f} s"),
        ("restored request (restore + 1 token)", f"{restored_ttft:.3f} s"),
        ("prefill / restore", f"{prefill / restore:.1f}×"),
        ("write-back (background, not waited on)", f"{write_back:.3f} s"),
    ]
    print("\n| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
