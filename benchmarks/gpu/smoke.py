"""First look at the GPU box: versions, the card's ceilings (bf16 matmul, device copy bandwidth), and the
engine on the tiny default on CUDA with the reference ops, checked against the same engine on the CPU.

    PYTHONPATH=. python benchmarks/gpu/smoke.py      # on the device machine; writes $OUT/smoke.json
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def timed(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def ceilings() -> dict[str, float]:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return {
        "bf16_matmul_tflops": 2 * n**3 / timed(lambda: a @ b) / 1e12,
        "copy_gb_per_s": 2 * src.numel() / timed(lambda: dst.copy_(src), 10) / 1e9,  # read + write
    }


def main() -> None:
    out = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }
    out.update(ceilings())

    from flashstate import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[(7 * i + j) % 2000 for i in range(300 + 50 * j)] for j in range(4)]
    runs = {}
    for device in ("cpu", "cuda"):
        llm = LLM(device=device, prefill_cost_coefficients=(1e-5, 1e-9))
        llm.generate(prompts[:1], params)
        start = time.perf_counter()
        first = llm.generate(prompts, params)
        second = llm.generate(
            [p + o.token_ids + [5, 6, 7] for p, o in zip(prompts, first, strict=True)], params
        )
        runs[device] = {
            "seconds": time.perf_counter() - start,
            "tokens": [o.token_ids for o in first + second],
            "cached": [o.num_cached_tokens for o in second],
        }
        llm.engine.check_integrity()
    out["engine_cuda_equals_cpu"] = runs["cpu"]["tokens"] == runs["cuda"]["tokens"]
    out["engine"] = {d: {"seconds": r["seconds"], "cached_second_turn": r["cached"]} for d, r in runs.items()}
    os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
    with open(os.path.join(os.environ.get("OUT", "."), "smoke.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
