"""How long the host tier's key chain of a prompt takes on a thread that shares the GIL with a busy one, as
the engine thread does with the server's threads (CPU). A lookup and a write-back hash every whole chunk
of the prompt (cache/host/layout.py); hashlib lets go of the GIL for an update of 2 KiB or more, and the
hashing thread then waits up to a switch interval (`flashstate serve --gil-switch-interval-ms`, 1 ms) to take
it back. A 1,024-token chunk is 4 KiB: fed whole, each chunk pays that wait; fed in the layout's 1 KiB
pieces, none does. The digests are the same either way.

    PYTHONPATH=. python benchmarks/host_hash_gil.py [--tokens 27000] [--chunk-tokens 1024] \
        [--switch-interval 0.001] [--repeats 20]

Prints a row per way of feeding the hash and per neighbour (none, a busy Python thread): the mean time of one
prompt's chain.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import threading
import time
from array import array

from flashstate.cache.host.layout import HostLayout


def whole_updates(tokens: list[int], chunk: int, root: bytes) -> list[bytes]:
    """The chain with each chunk fed to the hash in one update (what the layout did before its pieces)."""
    hashes = [root]
    for i in range(len(tokens) // chunk):
        h = hashlib.blake2b(digest_size=16)
        h.update(hashes[-1])
        h.update(array("I", tokens[i * chunk : (i + 1) * chunk]).tobytes())
        hashes.append(h.digest())
    return hashes


def timed(fn, repeats: int, busy: bool) -> float:
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    neighbour = threading.Thread(target=spin) if busy else None
    if neighbour is not None:
        neighbour.start()
        time.sleep(0.05)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    took = (time.perf_counter() - start) / repeats
    stop.set()
    if neighbour is not None:
        neighbour.join()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=27000)
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--switch-interval", type=float, default=0.001)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    sys.setswitchinterval(args.switch_interval)
    rng = random.Random(0)
    tokens = [rng.randrange(200_000) for _ in range(args.tokens)]
    layout = HostLayout("bench", args.chunk_tokens)
    root = layout.salted_root(None)
    depth = args.tokens // args.chunk_tokens * args.chunk_tokens
    if whole_updates(tokens, args.chunk_tokens, root) != layout.chain(tokens, depth):
        raise SystemExit("host_hash_gil: the two ways of feeding the hash disagree")
    ways = {
        "whole chunks": lambda: whole_updates(tokens, args.chunk_tokens, root),
        "layout (pieces)": lambda: layout.chain(tokens, depth),
    }
    said = f"{args.tokens:,} tokens, {args.chunk_tokens}-token chunks"
    print(f"{said}, switch interval {args.switch_interval} s")
    print("| feeding | neighbour | ms per chain |\n|---|---|---:|")
    for name, fn in ways.items():
        for busy in (False, True):
            ms = 1e3 * timed(fn, args.repeats, busy)
            print(f"| {name} | {'a busy thread' if busy else 'none'} | {ms:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
