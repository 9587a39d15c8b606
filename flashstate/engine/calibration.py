"""Measure C(n) = a·n + b·n² on the running model and device: time from-scratch prefills of several
lengths (chunked like the scheduler chunks them), fit a and b, cache the fit on disk keyed by the model
layout, dtype, device and chunk budget."""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

from flashstate.cache.cost import PrefillCost
from flashstate.engine.cache_tensors import CacheTensors
from flashstate.layers.metadata import ForwardMetadata
from flashstate.models.base import HybridForCausalLM
from flashstate.models.fingerprint import device_name, layout_fingerprint

logger = logging.getLogger("flashstate")


def default_cache_dir() -> Path:
    home = os.environ.get("FLASHSTATE_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "flashstate"
    return base / "calibration"


@torch.inference_mode()
def time_prefill(
    model: HybridForCausalLM,
    caches: CacheTensors,
    n: int,
    block_size: int,
    chunk: int,
    device: torch.device,
    repeats: int = 3,
) -> float:
    """Median seconds to prefill n fresh tokens (blocks 0.., state slot 0) in chunks of `chunk`."""
    caches.bind(model)
    table = list(range(-(-n // block_size)))
    tokens = torch.randint(0, model.spec.vocab_size, (n,), device=device)
    times = []
    for _ in range(repeats + 1):  # the first run warms up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            meta = ForwardMetadata.build([hi - lo], [hi], [table], block_size, [0], device=device)
            hidden = model(tokens[lo:hi], meta)
        model.compute_logits(hidden[-1:])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def max_calibration_tokens(
    device: torch.device, max_model_len: int, cache_tokens: int, asked: int | None = None
) -> int:
    """The longest prefill to time: what fits, capped (by default 1k tokens on CPU, 32k on GPU)."""
    cap = asked or (1024 if device.type == "cpu" else 32768)
    return min(max_model_len, cache_tokens, cap)


def calibration_lengths(max_tokens: int) -> list[int]:
    """Doublings from 128 up to `max_tokens`, the longest seven, ending at `max_tokens` itself: the long end
    is where the attention term shows (stopping at the seventh doubling, 8k, fitted b = 0 on the H200)."""
    lengths, n = [], 128
    while n < max_tokens:
        lengths.append(n)
        n *= 2
    lengths = [*lengths[-6:], max_tokens] if max_tokens >= 128 else []
    return lengths if len(lengths) >= 2 else [max(max_tokens // 2, 1), max_tokens]


def calibrate(
    model: HybridForCausalLM,
    caches: CacheTensors,
    block_size: int,
    chunk: int,
    max_tokens: int,
    device: torch.device,
) -> tuple[PrefillCost, dict]:
    lengths = calibration_lengths(max_tokens)
    seconds = [time_prefill(model, caches, n, block_size, chunk, device) for n in lengths]
    cost = PrefillCost.fit(lengths, seconds)
    return cost, {"lengths": lengths, "seconds": seconds}


def cache_path(
    model: HybridForCausalLM, device: torch.device, chunk: int, cache_dir: str | Path | None
) -> Path:
    dtype = next(model.parameters()).dtype
    key = layout_fingerprint(model.spec, dtype, device=device_name(device), chunk=chunk)
    return Path(cache_dir or default_cache_dir()) / f"{key}.json"


def save(path: Path, cost: PrefillCost, detail: dict, device: torch.device) -> None:
    date = time.strftime("%Y-%m-%d")
    record = {"a": cost.a, "b": cost.b, "device": device_name(device), "date": date, **detail}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)


def load_or_calibrate(
    model: HybridForCausalLM,
    caches: CacheTensors,
    block_size: int,
    chunk: int,
    max_tokens: int,
    device: torch.device,
    cache_dir: str | Path | None = None,
) -> PrefillCost:
    """The cached fit for this model layout + device, or a fresh calibration (then cached)."""
    path = cache_path(model, device, chunk, cache_dir)
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            return PrefillCost(float(data["a"]), float(data["b"]), f"cached:{path}")
        except (ValueError, KeyError) as e:
            logger.warning("ignoring unreadable calibration %s: %s", path, e)
    cost, detail = calibrate(model, caches, block_size, chunk, max_tokens, device)
    save(path, cost, detail, device)
    logger.info("calibrated prefill cost: C(n) = %.3g·n + %.3g·n² s (%s)", cost.a, cost.b, path)
    return cost
