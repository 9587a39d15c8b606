"""Start a TP=2 `flashstate serve` on the CPU (gloo), answer one request, then list the TCP sockets that
the server and its workers listen on: `ss -ltnp` (where installed) and the same from /proc.

    python benchmarks/results/robustness-2026-12-02/tp_sockets.py [--host 127.0.0.1] [--kill-rank-0]

With --kill-rank-0 it then SIGSTOPs the worker, SIGKILLs rank 0 and reports whether the worker is gone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout, for tests.processes

from tests.processes import alive, descendants, listening, wait_gone  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18431)
    p.add_argument("--kill-rank-0", action="store_true")
    args = p.parse_args()
    log = Path(tempfile.mkdtemp()) / "server.log"
    cmd = [sys.executable, "-m", "flashstate.cli", "serve", "--host", args.host, "--port", str(args.port)]
    cmd += ["--tensor-parallel-size", "2", "--kv-cache-memory-bytes", "32M"]
    cmd += ["--prefill-cost-coefficients", "1e-5", "1e-8"]
    print("$ python", " ".join(cmd[1:]))
    with open(log, "wb") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = (
        f"http://127.0.0.1:{args.port}"
        if args.host in ("0.0.0.0", "127.0.0.1")
        else f"http://{args.host}:{args.port}"
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        body = {"model": "flashstate-tiny", "prompt": [5, 6, 7, 8], "max_tokens": 3}
        httpx.post(f"{url}/v1/completions", json=body, timeout=60).raise_for_status()
        pids = [server.pid, *descendants(server.pid)]
        if shutil.which("ss"):
            ss = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout.splitlines()
            print("$ ss -ltnp  # lines of the server's processes")
            print(ss[0])
            print("\n".join(ln for ln in ss[1:] if any(f"pid={pid}," in ln for pid in pids)))
        print("\n/proc/net/tcp{,6} LISTEN sockets, by /proc/<pid>/fd inode:")
        for pid in pids:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2].decode()
            role = "rank 0 (server)" if pid == server.pid else f"child ({name})"
            print(f"pid {pid} {role}: {listening(pid) or 'none'}")
        if args.kill_rank_0:
            workers = [p for p in pids if p != server.pid and listening(p)]
            for w in workers:
                os.kill(w, signal.SIGSTOP)
            server.kill()
            server.wait()
            left = wait_gone(workers, 60)
            print(f"\nSIGSTOP worker(s) {workers}, SIGKILL rank 0: left running after 60 s: {left or 'none'}")
            for w in left:
                os.kill(w, signal.SIGKILL)
    finally:
        if alive(server.pid):
            server.terminate()
            server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
