"""What checking a host-tier object costs per GB on this CPU: CRC32 (always; zlib's and ISA-L's, the one the
codec uses where `isal` is installed), HMAC-SHA256 and keyed BLAKE2b
(the two MAC candidates under a deployment secret), and the tier's own seal / check of whole objects
(flashstate.cache.host.codec: the check with a secret verifies the MAC instead of the CRC).

    PYTHONPATH=. .venv/bin/python benchmarks/faults/mac_cost.py [--mib 256] [--repeat 5]

One thread; the codec runs these on its verify pool (every one lets go of the GIL), so N cores check N
objects at once. Seconds per GB are the best of --repeat runs.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import time
import zlib

import torch
from isal import isal_zlib

from flashstate.cache.host.codec import ObjectBuilder, check

SECRET = b"a deployment secret of 32 bytes!"


def best(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256, help="bytes hashed per run, in MiB")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    n = args.mib << 20
    data = memoryview(os.urandom(n))
    chunk = 16 << 20  # a large chunk object's size
    objects = []
    for i in range(n // chunk):
        b = ObjectBuilder(f"flashstate/bench/kv/{i}", [(torch.float32, (chunk // 4 - 1024,))], secret=SECRET)
        values = bytearray(data[i * chunk : (i + 1) * chunk - 4096])
        b.tensors[0].copy_(torch.frombuffer(values, dtype=torch.float32))
        objects.append(b)
    pairs = [(b, b.seal()) for b in objects]
    rows = {
        "crc32 (zlib)": lambda: zlib.crc32(data),
        "crc32 (ISA-L, isal)": lambda: isal_zlib.crc32(data),
        "hmac-sha256 (hashlib, OpenSSL)": lambda: hmac.new(SECRET, data, hashlib.sha256).digest(),
        "keyed blake2b-256 (hashlib)": lambda: hashlib.blake2b(data, key=SECRET, digest_size=32).digest(),
        "codec seal, with a secret (MAC + CRC)": lambda: [b.seal() for b in objects],
        "codec check, no secret (CRC)": lambda: [check(b.key, s) for b, s in pairs],
        "codec check, secret (MAC)": lambda: [check(b.key, s, secret=SECRET) for b, s in pairs],
    }
    gb = n / 1e9
    print(f"{args.mib} MiB, best of {args.repeat}, one thread ({os.cpu_count()} cores)")
    print("| what | s/GB | GB/s |\n|---|---|---|")
    for name, fn in rows.items():
        s = best(fn, args.repeat) / gb
        print(f"| {name} | {s:.3f} | {1 / s:.2f} |")


if __name__ == "__main__":
    main()
