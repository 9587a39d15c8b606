"""Where a real-size preset's prefill time goes: one T-token prompt through `engine.step()` under the torch
profiler, GPU kernel time summed by part (attention, MoE experts, MoE routing, dense GEMMs, recurrent
mixers, norms / elementwise), on the preset's config cut to a few layers at its real widths (the layer
pattern's first N entries: every kind of layer kept), so a breakdown costs seconds, not a 3-minute start.
Also says whether the model captured its decode and mixed-step CUDA graphs (and why not), issue 30.

    source benchmarks/gpu/device_env.sh
    python benchmarks/gpu/prefill_breakdown.py nemotron-3-nano-30b-a3b kimi-linear-48b-a3b [--tokens 32768]

Writes $OUT/prefill_breakdown_<preset>.json (every kernel's time); prints one table last."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, os.getcwd())

from flashstate import LLM, SamplingParams  # noqa: E402
from flashstate.spec.preset_configs import preset_config  # noqa: E402

# kernel-name fragments → part (first match wins; lower-case)
PARTS = (
    ("moe routing", ("align", "topk", "sort", "searchsorted", "scatter_add", "router", "softmax", "sigmoid")),
    ("moe experts", ("expert",)),
    ("attention", ("attn", "attention", "flash", "fmha", "sdpa", "mla")),
    ("recurrent", ("chunk", "delta", "kda", "ssd", "mamba", "conv", "fwd_kernel", "state", "wy")),
    ("dense gemm", ("gemm", "cutlass", "nvjet", "sm90_xmma", "matmul", "cublas", "block_fp8", "fp8")),
    ("norms / elementwise", ("norm", "elementwise", "vectorized", "reduce", "copy", "cat", "fill", "index")),
)


def part_of(name: str) -> str:
    low = name.lower()
    for part, keys in PARTS:
        if any(k in low for k in keys):
            return part
    return "other"


def cut_config(name: str, layers: int) -> dict:
    """The preset's config with its first `layers` layers (pattern and layer lists cut alike)."""
    cfg = preset_config(name)
    text = cfg.get("text_config", cfg)
    text["num_hidden_layers"] = layers
    if "hybrid_override_pattern" in text:
        text["hybrid_override_pattern"] = text["hybrid_override_pattern"][:layers]
    if "layer_types" in text:
        text["layer_types"] = text["layer_types"][:layers]
    linear = text.get("linear_attn_config")
    if linear:  # 1-based layer numbers
        linear["full_attn_layers"] = [i for i in linear["full_attn_layers"] if i <= layers]
        linear["kda_layers"] = [i for i in linear["kda_layers"] if i <= layers]
    for key in ("mlp_only_layers",):
        if key in text:
            text[key] = [i for i in text[key] if i < layers]
    return cfg


def breakdown(name: str, layers: int, tokens: int, extra: dict) -> dict:
    directory = Path(tempfile.mkdtemp()) / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(cut_config(name, layers)))
    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    handler = Keep()
    logging.getLogger("flashstate").addHandler(handler)
    llm = LLM(str(directory), load_format="dummy", max_model_len=tokens + 512, max_num_batched_tokens=tokens,
              max_num_seqs=16, prefill_cost_coefficients=(1e-5, 1e-10), **extra)  # fmt: skip
    logging.getLogger("flashstate").removeHandler(handler)
    engine = llm.engine
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    g = torch.Generator().manual_seed(0)

    def one() -> float:
        ids = torch.randint(100, 30000, (tokens,), generator=g).tolist()
        engine.add_request(ids, params)
        torch.cuda.synchronize()
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    one()  # builds this length's kernel variants
    wall = one()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        one()
    mixed = engine.runner.mixed
    kernels: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name] += event.device_time_total / 1e3  # ms
    parts: dict[str, float] = defaultdict(float)
    for kernel, ms in kernels.items():
        parts[part_of(kernel)] += ms
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:25]
    result = {
        "preset": name, "layers": layers, "tokens": tokens, "wall_s": wall, "extra": extra,
        "decode_graphs": list(getattr(engine.runner.graphs, "sizes", []) or []),
        "mixed_graphs": mixed is not None and any(map(mixed.captured, mixed.keys())),
        "warnings": warnings, "parts_ms": dict(parts), "top_kernels_ms": top,
    }  # fmt: skip
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="+")
    ap.add_argument("--layers", type=int, default=8, help="layers kept from each preset's pattern")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (a faster start)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one preset, JSON out
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    extra = {"quantization": a.quantization} if a.quantization else {}
    if a.enforce_eager:
        extra["enforce_eager"] = True
    out = Path(os.environ.get("OUT", "."))
    if a.one:
        name = a.presets[0]
        r = breakdown(name, a.layers, a.tokens, extra)
        (out / f"prefill_breakdown_{name}.json").write_text(json.dumps(r, indent=1))
        return
    rows = []
    for name in a.presets:  # one process each: a preset's memory is gone before the next starts
        args = [sys.executable, __file__, name, "--one", "--layers", str(a.layers), "--tokens", str(a.tokens)]
        args += ["--quantization", a.quantization] if a.quantization else []
        args += ["--enforce-eager"] if a.enforce_eager else []
        done = subprocess.run(args, capture_output=True, text=True)
        path = out / f"prefill_breakdown_{name}.json"
        if done.returncode == 0 and path.exists():
            rows.append(json.loads(path.read_text()))
        else:
            rows.append({"preset": name, "error": done.stderr.strip().splitlines()[-1:] or done.returncode})
    print("| preset | layers | prefill s | " + " | ".join(p for p, _ in PARTS) + " | other | graphs |")
    for r in rows:
        if "error" in r:
            print(f"| {r['preset']} | error: {r['error']} |")
            continue
        total = sum(r["parts_ms"].values()) or 1.0
        shares = " | ".join(f"{100 * r['parts_ms'].get(p, 0) / total:.0f}%" for p, _ in PARTS)
        graphs = f"decode {len(r['decode_graphs'])}, mixed {'yes' if r['mixed_graphs'] else 'no'}"
        print(f"| {r['preset']} | {r['layers']} | {r['wall_s']:.3f} | {shares} | "
              f"{100 * r['parts_ms'].get('other', 0) / total:.0f}% | {graphs} |")  # fmt: skip
    for r in rows:
        for w in r.get("warnings", []):
            print(f"{r['preset']}: {w}")


if __name__ == "__main__":
    main()
