"""The garbage collector's pauses at several generation-0 thresholds, in the simulator (CPU): the headline's
run (48 agents, 270 s, 17G, 64G host tier, qwen3-next-2b's served profile) replayed in this process after
the start-up is frozen, as `flashstate serve` does (flashstate/gc_pauses.py). The simulator allocates like the
server's scheduler and cache (Sequences with their token ids, tree nodes, host index entries), not like its
HTTP layer or the model forward.

    PYTHONPATH=. .venv/bin/python benchmarks/gc_pauses.py --traces .traces/claude-code \
        --thresholds 0,5000,10000,50000

(0: the interpreter's default.) Each threshold runs in a fresh process."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import runpy
import shlex
import subprocess
import sys
import time


def one(traces: str, threshold: int) -> dict:
    import flashstate.cli  # noqa: F401 — imported before the freeze, as the server's modules are
    from flashstate.gc_pauses import GcPauses

    gc.collect()
    gc.freeze()
    if threshold:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(threshold, gen1, gen2)
    pauses = GcPauses().install()
    serve = "--max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes 17G --host-cache memory"
    sys.argv = shlex.split(
        f"flashstate simulate --profile h200-qwen3-next-2b-served --policies flashstate --workload {traces} "
        f"--serve-args '{serve} --host-cache-bytes 64G' --seed 0 --agents 48 --warmup 15 --duration 270 "
        "--drain 10 --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 "
        f"--max-output-tokens 512 --no-progress --out /tmp/gc-pauses-{threshold}"
    )
    start = time.perf_counter()
    with contextlib.suppress(SystemExit):
        runpy.run_module("flashstate.cli", run_name="__main__")
    return {
        "threshold": threshold or gc.get_threshold()[0],
        "wall_s": time.perf_counter() - start,
        "collections": pauses.count,
        "seconds": pauses.seconds,
        "longest_ms": [1e3 * s for s in pauses.longest],
        "over_50ms": pauses.long,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", required=True)
    p.add_argument("--thresholds", default="0,5000,10000,50000")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.traces, args.one)))
        return
    print("| gen-0 threshold | collections (gen 0/1/2) | collector s | longest ms | pauses over 50 ms |")
    print("|---|---|---|---|---|")
    for t in (int(x) for x in args.thresholds.split(",")):
        out = subprocess.run([sys.executable, __file__, "--traces", args.traces, "--one", str(t)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| {r['threshold']} | {'/'.join(map(str, r['collections']))} | {sum(r['seconds']):.2f} "
              f"| {max(r['longest_ms']):.0f} | {sum(r['over_50ms'])} |")  # fmt: skip


if __name__ == "__main__":
    main()
