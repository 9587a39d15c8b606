"""Cold start (issue 32, item 5): a `flashstate serve` process timed from its launch to the first `/health`
200, with the phases its log names (checkpoint loaded, kernel archive restored, calibration, decode and
mixed-step graphs, serving). Each start gets its own empty Triton cache, so what it does not compile
comes from `--kernel-cache` (or nowhere), and none finds an earlier start's prefill-cost calibration: the
machine is bare but for that archive.

    source benchmarks/gpu/device_env.sh
    python benchmarks/gpu/cold_start.py --serve-args "--max-num-seqs 96 --max-num-batched-tokens 8192 \
        --kv-cache-memory-bytes 20183144818 --kernel-cache /tmp/kc" --out $OUT/cold-start

Prints one table row per start (`--starts N`); the server logs go under `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())

from flashstate.bench.compare import free_port, wait_ready  # noqa: E402
from flashstate.models.presets import preset_dir  # noqa: E402

# log line → phase name; the first line matching each pattern marks the phase's end
PHASES = (
    ("weights", re.compile(r"checkpoint shard \d+/\d+")),
    ("kernels restored", re.compile(r"kernel cache: (\d+ kernel files restored|no archive|cannot read)")),
    ("decode graphs", re.compile(r"captured decode CUDA graphs")),
    ("mixed graphs", re.compile(r"captured \d+ mixed-step CUDA graphs")),
    ("serving", re.compile(r"flashstate\.server: serving ")),
)
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def phases(log: str, t_launch: float) -> dict[str, float]:
    """Seconds from launch to the first log line of each phase (wall clock: the log's stamps)."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
        for name, pattern in PHASES:
            if name not in out and pattern.search(line):
                out[name] = round(t - t_launch, 1)
    return out


def start_once(model: str, serve_args: list[str], log_path: Path, timeout: float) -> dict:
    port = free_port()
    env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="triton-bare-"))
    cmd = [
        sys.executable,
        "-m",
        "flashstate.cli",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        *serve_args,
    ]
    if "--calibration-cache-dir" not in serve_args:  # nor a calibration from an earlier start
        cmd += ["--calibration-cache-dir", tempfile.mkdtemp(prefix="calibration-bare-")]
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout, proc, log_path)
        health_s = time.time() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)  # the kernel archive is written at close
        except subprocess.TimeoutExpired:
            proc.kill()
    text = log_path.read_text(errors="replace")
    compiled = text.count("a kernel variant first built while serving")
    return {
        "health_s": round(health_s, 1),
        "phases": phases(text, t0),
        "log": str(log_path),
        "compiles_logged": compiled,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-next-2b")
    p.add_argument("--serve-args", default="--max-num-seqs 96 --max-num-batched-tokens 8192")
    p.add_argument("--device-args", default="--device cuda --dtype bfloat16")
    p.add_argument("--starts", type=int, default=1)
    p.add_argument("--timeout", type=float, default=540)
    p.add_argument("--out", type=Path, default=Path("cold-start"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = str(preset_dir(args.preset))  # built (written to disk) before the clock starts, like a download
    serve_args = shlex.split(args.device_args) + shlex.split(args.serve_args)
    rows = []
    for i in range(args.starts):
        row = start_once(model, serve_args, args.out / f"server-{i}.log", args.timeout)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "starts.json").write_text(json.dumps({"serve_args": serve_args, "starts": rows}, indent=1))
    names = [n for n, _ in PHASES]
    print("| start | " + " | ".join(names) + " | /health (s) |")
    print("|---" * (len(names) + 2) + "|")
    for i, row in enumerate(rows):
        cells = [str(row["phases"].get(n, "–")) for n in names]
        print(f"| {i} | " + " | ".join(cells) + f" | **{row['health_s']}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
