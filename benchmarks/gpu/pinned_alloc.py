"""What a fresh page-locked host buffer costs, and what it does to kernel launches on another thread.

    PYTHONPATH=. python benchmarks/gpu/pinned_alloc.py   # CUDA; a table, and $OUT/pinned_alloc.json

The host tier builds every write-back object in pinned memory. torch's caching host allocator rounds a
request up to a power of two and only reuses a freed block, so while the store fills, every object is a
new cudaHostAlloc. This times (1) fresh pinned buffers of a chunk's and a state's size, (2) the same sizes
again from the allocator's cache, (3) a step-like loop of small kernels alone and while another thread
allocates fresh pinned buffers, (4) page-locking a large pageable buffer once (cudaHostRegister).
"""

from __future__ import annotations

import json
import os
import threading
import time

import torch

MB = 1 << 20


def _fresh(nbytes: int, count: int) -> tuple[float, list[torch.Tensor]]:
    held = []
    start = time.perf_counter()
    for _ in range(count):
        held.append(torch.empty(nbytes, dtype=torch.uint8, pin_memory=True))
    return (time.perf_counter() - start) / count * 1e3, held


def _launch_loop(x: torch.Tensor, steps: int = 50, kernels: int = 200) -> float:
    """Mean ms of a 'step': `kernels` small launches, then a sync."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        for _ in range(kernels):
            x.add_(1.0)
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    rows = []
    for name, nbytes, count in (("chunk 3 MiB", 3 * MB, 200), ("state 62 MiB", 62 * MB, 40)):
        ms, held = _fresh(nbytes, count)
        del held
        again, held = _fresh(nbytes, count)
        del held
        rows.append((f"fresh pinned {name}", ms, f"{nbytes / MB / ms:.2f} GB/s"))
        rows.append((f"cached pinned {name}", again, ""))
        print(rows[-2:], flush=True)
    x = torch.zeros(1 << 18, device="cuda")
    _launch_loop(x, 5)
    alone = _launch_loop(x)
    stop = threading.Event()
    allocated = []

    def allocate() -> None:
        while not stop.is_set() and len(allocated) < 64:  # 4 GiB at most
            allocated.append(
                torch.empty(62 * MB + 12345 * len(allocated), dtype=torch.uint8, pin_memory=True)
            )

    t = threading.Thread(target=allocate)
    t.start()
    busy = _launch_loop(x, 10)
    stop.set()
    t.join()
    rows.append(("step of 200 small kernels, alone", alone, ""))
    rows.append(("same, another thread allocating pinned", busy, f"{len(allocated)} buffers meanwhile"))
    print(rows[-2:], flush=True)
    allocated.clear()
    big = torch.empty(2048 * MB, dtype=torch.uint8)
    big.fill_(0)
    start = time.perf_counter()
    rc = torch.cuda.cudart().cudaHostRegister(big.data_ptr(), big.numel(), 0)
    reg = (time.perf_counter() - start) * 1e3
    rows.append(("cudaHostRegister 2 GiB (touched)", reg, f"rc {int(rc)}"))
    torch.cuda.cudart().cudaHostUnregister(big.data_ptr())
    out["rows"] = [{"what": w, "ms": ms, "note": n} for w, ms, n in rows]
    folder = os.environ.get("OUT", ".")
    with open(os.path.join(folder, "pinned_alloc.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"\n{out['device']}, torch {out['torch']}\n| what | ms | note |\n|---|---:|---|")
    for w, ms, n in rows:
        print(f"| {w} | {ms:.3f} | {n} |")


if __name__ == "__main__":
    main()
