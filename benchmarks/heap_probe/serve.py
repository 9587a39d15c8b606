"""A server with tracemalloc on: each SIGUSR1 takes a snapshot and writes its diff against the first to
/tmp/memdiffN.txt (the Python heap's growth by traceback). Drive it with drive.py, e.g.

    python benchmarks/heap_probe/serve.py & sleep 120
    python benchmarks/heap_probe/drive.py 100; kill -USR1 %1
    python benchmarks/heap_probe/drive.py 300; kill -USR1 %1
"""

import signal
import sys
import tracemalloc

tracemalloc.start(10)
from flashstate.config import EngineConfig  # noqa: E402 — allocations traced from here on
from flashstate.server.app import serve  # noqa: E402

snaps = []


def on_usr1(*_):
    snaps.append(tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)]))
    if len(snaps) >= 2:
        stats = snaps[-1].compare_to(snaps[0], "traceback")[:12]
        with open(f"/tmp/memdiff{len(snaps)}.txt", "w") as f:
            total = sum(s.size_diff for s in snaps[-1].compare_to(snaps[0], "filename"))
            f.write(f"total diff {total / 2**20:.1f} MiB\n")
            for s in stats:
                f.write(f"{s.size_diff / 2**20:+.2f} MiB, count {s.count_diff:+d}\n")
                f.write("\n".join(s.traceback.format()[-12:]) + "\n\n")


signal.signal(signal.SIGUSR1, on_usr1)
sys.exit(
    serve(
        EngineConfig(
            port=8141,
            kv_cache_memory_bytes=16 << 20,
            max_model_len=4096,
            prefill_cost_coefficients=(1e-5, 1e-10),
        )
    )
)
