"""How long a host-tier fetch takes while another thread keeps the GIL busy, as the engine thread does while
it issues an eager prefill forward (CPU). On the H200 (session 10) served fetches of ~90 chunk objects took
0.076 s at the median, 0.06 s with no other fetch in flight.

A fetch (`HostTier.fetch`, on the tier's fetch thread) reads a state's objects, verifies each on the verify
pool (zlib's crc32 releases the GIL) and makes its tensor views: every object gives the GIL up and takes it
back, and a thread that wants it back waits up to the interpreter's switch interval (`sys.setswitchinterval`,
5 ms by default; `flashstate serve --gil-switch-interval-ms`, 1 ms) for a busy holder to drop it.

    PYTHONPATH=. python benchmarks/host_fetch_gil.py [--tokens 24000] [--switch-interval 0.001] \
        [--chunk-tokens 1024]

Prints one row: the fetch's median wall time with the GIL idle and beside a busy Python thread, the object
count, and the busy thread's rounds a second while the fetches ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from flashstate import LLM, SamplingParams
from flashstate.models.presets import materialize


def busy(stop: threading.Event, done: list[int]) -> None:
    """Pure Python work in short bytecode runs, like a forward's kernel launches; counts its rounds."""
    while not stop.is_set():
        sum(i * i for i in range(200))
        done[0] += 1


def timed_fetches(tier, hit, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        objects = tier.fetch(hit)
        out.append(time.perf_counter() - start)
        assert objects is not None and len(objects) == len(hit.chunks) + 1
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (s)")
    p.add_argument("--chunk-tokens", type=int, default=256, help="tokens per chunk object")
    p.add_argument("--out", default=None, help="JSON file for the rows")
    args = p.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    model = Path(tempfile.mkdtemp()) / "tiny"
    materialize("tiny", model, seed=0)
    llm = LLM(str(model), device="cpu", max_num_batched_tokens=4096, kv_cache_memory_bytes=1 << 30,
              host_cache_bytes=2 << 30, max_model_len=args.tokens + 64,
              host_chunk_tokens=args.chunk_tokens)  # fmt: skip
    prompt = [(7 * i) % 1000 + 10 for i in range(args.tokens)]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))[0]
    tier = llm.engine.host
    tier.flush()
    tokens = prompt + out.token_ids
    hit = tier.lookup(tokens, len(tokens))
    if hit is None:
        raise SystemExit("host_fetch_gil: the state was not written back (host tier too small?)")
    rows = {"objects": len(hit.chunks) + 1, "depth": hit.depth}
    timed_fetches(tier, hit, 2)  # the verify pool's threads started, the layouts cached
    rows["idle_s"] = timed_fetches(tier, hit, args.repeats)
    stop, done = threading.Event(), [0]
    worker = threading.Thread(target=busy, args=(stop, done), daemon=True)
    start = time.perf_counter()
    worker.start()
    try:
        rows["busy_s"] = timed_fetches(tier, hit, args.repeats)
    finally:
        stop.set()
        worker.join()
    rows["busy_rounds_per_s"] = done[0] / (time.perf_counter() - start)
    llm.close()
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    med = {k: statistics.median(rows[k]) for k in ("idle_s", "busy_s")}
    print("| switch interval | objects | fetch, GIL idle (median) | fetch, busy thread (median) "
          "| busy rounds/s |")  # fmt: skip
    print(
        f"| {sys.getswitchinterval() * 1e3:g} ms | {rows['objects']} | {1e3 * med['idle_s']:.1f} ms "
        f"| {1e3 * med['busy_s']:.1f} ms | {rows['busy_rounds_per_s']:.0f} |"
    )


if __name__ == "__main__":
    main()
