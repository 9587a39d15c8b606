"""Measure C(n) = a·n + b·n² on the running model and device: time from-scratch prefills of several
lengths (chunked like the scheduler chunks them), fit a and b, cache the fit on disk keyed by the model
layout, dtype, device and chunk budget, with the hardware it was measured on.

A fit from a busy machine would be kept forever, so a measurement is judged before it is used (`judge`):
each length is timed several times and the repeats must agree (the slowest within MAX_SPREAD of the
fastest), the times must grow with the length, the fit must explain them (R² ≥ MIN_R2), and neither
coefficient may sit at its clamp (a = 0 or b = 0: every token costs something, and attention's cost grows
with the length). Where the shortest lengths all take about as long as the shortest (within FLAT of it: a
fast GPU launching kernels rather than computing, the eager forward's host work), the fit starts at the
last of them: those times say nothing of the per-token cost. A rejected measurement is retried up to
MAX_ATTEMPTS times in all; then the default cost is used, nothing is cached on disk (the process itself
does not measure again), and the log says why.
A cached fit is used only on the hardware it was measured on (`hardware`: device, core count, torch and
CUDA versions, ...); elsewhere it is measured again.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from flashstate import envs
from flashstate.cache.cache_tensors import CacheTensors
from flashstate.cache.cost import DEFAULT_COST, PrefillCost
from flashstate.layers.metadata import ForwardMetadata
from flashstate.models.base import HybridForCausalLM
from flashstate.models.fingerprint import device_name, layout_fingerprint

logger = logging.getLogger("flashstate")

REPEATS = 3  # timed runs per length (after one warm-up run)
MAX_ATTEMPTS = 3  # measurements before falling back to the default cost
MAX_SPREAD = 0.5  # (slowest − fastest) / fastest repeat of one length
MIN_R2 = 0.98
FLAT = 0.5  # a length whose median time is within this of the shortest's is launch-bound
MIN_FITTED = 3  # lengths a fit keeps, launch-bound or not


def default_cache_dir() -> Path:
    return envs.FLASHSTATE_HOME / "calibration"


@torch.inference_mode()
def time_prefill_runs(
    model: HybridForCausalLM,
    caches: CacheTensors,
    n: int,
    block_size: int,
    chunk: int,
    device: torch.device,
    repeats: int = REPEATS,
) -> list[float]:
    """Seconds of each of `repeats` prefills of n fresh tokens (blocks 0.., state slot 0) in chunks of
    `chunk`, after one warm-up prefill."""
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
    return times[1:]


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


def r_squared(lengths: list[int], seconds: list[float], cost: PrefillCost) -> float:
    """The share of the times' variance the fit explains (1: all of it)."""
    mean = statistics.fmean(seconds)
    total = sum((t - mean) ** 2 for t in seconds)
    residual = sum((t - cost(n)) ** 2 for n, t in zip(lengths, seconds, strict=True))
    return 1.0 - residual / total if total > 0 else 0.0


def judge(lengths: list[int], runs: list[list[float]], cost: PrefillCost) -> str | None:
    """Why this measurement (each length's repeated times) and its fit look like a noisy machine's, or None
    when they can be trusted."""
    for n, times in zip(lengths, runs, strict=True):
        fastest, slowest = min(times), max(times)
        if fastest <= 0 or (slowest - fastest) / fastest > MAX_SPREAD:
            return (
                f"the repeats of {n} tokens spread {fastest:.4g}..{slowest:.4g} s "
                f"(over {MAX_SPREAD:.0%} apart)"
            )
    medians = [statistics.median(t) for t in runs]
    for (n0, t0), (n1, t1) in itertools.pairwise(zip(lengths, medians, strict=True)):
        if t1 <= t0:
            return f"{n1} tokens took no longer than {n0} ({t1:.4g} s ≤ {t0:.4g} s)"
    if cost.a <= 0 or cost.b <= 0:
        return f"the fit C(n) = {cost.a:.3g}·n + {cost.b:.3g}·n² has a term clamped to 0"
    r2 = r_squared(lengths, medians, cost)
    if r2 < MIN_R2:
        return f"the fit explains too little of the times (R² = {r2:.3f} < {MIN_R2})"
    return None


Measure = Callable[[int], list[float]]  # a length → its repeated times in seconds


def compute_bound_from(seconds: list[float]) -> int:
    """Index of the first length to fit: the last of the leading lengths whose median time is within FLAT of
    the shortest's (0 when the next length already takes longer than that), leaving MIN_FITTED lengths."""
    first, k = seconds[0], 0
    while k + 1 < len(seconds) and first > 0 and abs(seconds[k + 1] / first - 1) <= FLAT:
        k += 1
    return max(min(k, len(seconds) - MIN_FITTED), 0)


def calibrate(
    model: HybridForCausalLM,
    caches: CacheTensors,
    block_size: int,
    chunk: int,
    max_tokens: int,
    device: torch.device,
    attempts: int = MAX_ATTEMPTS,
    measure: Measure | None = None,
) -> tuple[PrefillCost, dict]:
    """The measured fit (source "measured"), or DEFAULT_COST when every attempt was rejected (the detail
    then says why under "rejected"). The detail holds the last attempt's lengths, median seconds and repeats,
    and every rejection in turn."""
    if measure is None:

        def measure(n: int) -> list[float]:
            return time_prefill_runs(model, caches, n, block_size, chunk, device)

    lengths = calibration_lengths(max_tokens)
    rejections: list[str] = []
    for _ in range(max(attempts, 1)):
        runs = [measure(n) for n in lengths]
        medians = [statistics.median(t) for t in runs]
        k = compute_bound_from(medians)
        fitted, runs, seconds = lengths[k:], runs[k:], medians[k:]
        cost = PrefillCost.fit(fitted, seconds, "measured")
        detail = {
            "lengths": fitted,
            "launch_bound": lengths[:k],
            "seconds": seconds,
            "runs": runs,
            "r2": r_squared(fitted, seconds, cost),
        }
        reason = judge(fitted, runs, cost)
        if reason is None:
            return cost, {**detail, "rejections": rejections}
        rejections.append(reason)
        logger.info("prefill-cost calibration attempt %d rejected: %s", len(rejections), reason)
    logger.warning(
        "prefill-cost calibration rejected %d times (a busy machine?): %s; using the default C(n) = "
        "%.3g·n + %.3g·n² (pass --prefill-cost-coefficients, or run `flashstate calibrate` when it is idle)",
        len(rejections),
        "; ".join(rejections),
        DEFAULT_COST.a,
        DEFAULT_COST.b,
    )
    return DEFAULT_COST, {**detail, "rejections": rejections, "rejected": rejections[-1]}


def hardware(device: torch.device) -> dict[str, object]:
    """What a cached fit was measured on; a fit is reused only where this is the same."""
    record: dict[str, object] = {
        "device": device_name(device),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        record |= {
            "cuda": torch.version.cuda,
            "gpu_memory": props.total_memory,
            "gpu_sms": props.multi_processor_count,
            "gpu_capability": f"{props.major}.{props.minor}",
        }
    return record


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def cache_path(
    model: HybridForCausalLM, device: torch.device, chunk: int, cache_dir: str | Path | None
) -> Path:
    dtype = next(model.parameters()).dtype
    key = layout_fingerprint(model.spec, dtype, device=device_name(device), chunk=chunk)
    return Path(cache_dir or default_cache_dir()) / f"{key}.json"


def save(path: Path, cost: PrefillCost, detail: dict, device: torch.device) -> bool:
    """Cache a measured fit (with the hardware it was measured on); a rejected one is not cached."""
    if "rejected" in detail or cost.kind != "measured":
        logger.warning("prefill-cost calibration not cached (%s)", detail.get("rejected", cost.kind))
        return False
    date = time.strftime("%Y-%m-%d")
    record = {"a": cost.a, "b": cost.b, "device": device_name(device), "date": date, **detail}
    record["hardware"] = hardware(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
    return True


def _cached(path: Path, device: torch.device) -> PrefillCost | None:
    """The fit cached at `path` if it was measured on this hardware and looks sound, else None (why: in
    the log)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        cost = PrefillCost(float(data["a"]), float(data["b"]), "cached")
    except (ValueError, KeyError, TypeError) as e:
        logger.warning("ignoring unreadable calibration %s: %s", path, e)
        return None
    here, there = hardware(device), data.get("hardware")
    if not isinstance(there, dict) or here != there:
        changed = sorted(k for k in here if not isinstance(there, dict) or there.get(k) != here[k])
        logger.info("re-calibrating: the cached fit %s was measured on other hardware (%s)", path, changed)
        return None
    if cost.a <= 0 or cost.b <= 0:
        logger.info("re-calibrating: the cached fit %s has a term clamped to 0", path)
        return None
    return cost


def load_or_calibrate(
    model: HybridForCausalLM,
    caches: CacheTensors,
    block_size: int,
    chunk: int,
    max_tokens: int,
    device: torch.device,
    cache_dir: str | Path | None = None,
) -> PrefillCost:
    """The cached fit for this model layout, device and hardware, or a fresh calibration (then cached),
    or the default cost when the machine is too noisy to measure."""
    path = cache_path(model, device, chunk, cache_dir)
    cost = _cached(path, device)
    if cost is not None:
        logger.info("prefill cost C(n) = %.3g·n + %.3g·n² s, cached in %s", cost.a, cost.b, path)
        return cost
    if path in _rejected:  # this process already failed to measure it: engines after the first start fast
        logger.warning("prefill cost: the default (calibration rejected earlier: %s)", _rejected[path])
        return DEFAULT_COST
    cost, detail = calibrate(model, caches, block_size, chunk, max_tokens, device)
    if save(path, cost, detail, device):
        logger.info("calibrated prefill cost: C(n) = %.3g·n + %.3g·n² s (%s)", cost.a, cost.b, path)
    elif "rejected" in detail:
        _rejected[path] = detail["rejected"]
    return cost


_rejected: dict[Path, str] = {}  # cache path → why its calibration was rejected in this process
