"""Eviction index (issue 28): seconds per victim by a scan of the whole tree vs from the index, on a prefix
tree of about 10^5 cached units shaped like coding agents' sessions. CPU only, one command:

    .venv/bin/python benchmarks/eviction_index.py [--sessions 5000] [--turns 10] [--scan-victims 3]

The tree: sessions on a few shared system prompts (each with a checkpoint at its end), growing a turn at a
time, round-robin (user message, then reply), with a checkpoint at each user message's end (a chat-message
export) and at each turn's end (the frontier); a fifth of the sessions fork a sub-agent off an earlier
turn (a split and a branch point). The last sessions still run: they hold references on their blocks and
a lock on their frontier's path. Per policy and victim kind, units are evicted one at a time as the cache
manager does: first `--scan-victims` by `scan_victim` (the reference, every node looked at; each checked
to be the index's pick), then `--victims` by `EvictionIndex.victim`. Columns: seconds per victim of each,
the index's build (attached to the full tree, then its first query), and seconds per eviction (the tree's
removal and the index's upkeep, paid at the next query).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.cost import PrefillCost
from flashstate.cache.eviction_index import EvictionIndex, scan_victim
from flashstate.cache.policy import Policy
from flashstate.cache.tree import Node, RadixTree

BLOCK = 16
VOCAB = range(50_000)


def build(sessions: int, turns: int, prefixes: int, running: int, seed: int) -> tuple[RadixTree, float]:
    """The tree, and the time of its last stamp."""
    rng = random.Random(seed)
    systems = [rng.choices(VOCAB, k=rng.randint(1000, 3000)) for _ in range(prefixes)]
    lengths = [[(rng.randint(50, 400), rng.randint(20, 300)) for _ in range(turns)] for _ in range(sessions)]
    total = sum(len(s) for s in systems) + sum(u + r for s in lengths for u, r in s) * 6 // 5
    pool = BlockPool(total // BLOCK + 4 * sessions * turns + 1024, BLOCK)
    tree = RadixTree(pool)
    slots = iter(range(1 << 62))
    stamp = Policy("flashstate", cost=PrefillCost(1e-5, 1e-7), bytes_per_block=1, bytes_per_slot=1)

    def checkpoint(tokens: list[int], table: list[int], now: float, frontier: bool) -> Node:
        node, _ = tree.insert(tokens, table, len(tokens))
        if node.slot is None:
            node.slot, node.frontier = next(slots), frontier
        stamp.stamp(node, now)
        return node

    def grow(tokens: list[int], table: list[int], new: list[int]) -> None:
        tokens += new
        table += pool.allocate(pool.blocks_for(len(tokens)) - len(table))

    now = 0.0
    contexts, tables = [], []
    for s in range(sessions):  # a session starts from its system prompt's cached blocks
        system = systems[s % prefixes]
        shared = pool.blocks_for(len(system)) - 1
        if s < prefixes:
            table = pool.allocate(shared + 1)
            checkpoint(system, table, now, frontier=False)
        else:
            table = tree.block_table(tree.match(system).node)[:shared]
            pool.incref(table)
            table += pool.allocate(1)  # the partial last block, copied
        contexts.append(list(system))
        tables.append(table)
    for turn in range(turns):
        for s in range(sessions):
            now += 60.0 / sessions
            user, reply = lengths[s][turn]
            tokens, table = contexts[s], tables[s]
            grow(tokens, table, rng.choices(VOCAB, k=user))
            checkpoint(tokens, table, now, frontier=False)
            grow(tokens, table, rng.choices(VOCAB, k=reply))
            checkpoint(tokens, table, now, frontier=True)
            if turn and rng.random() < 0.2 / (turns - 1):  # a sub-agent forks off an earlier turn
                cut = rng.randint(len(systems[s % prefixes]) + 1, len(tokens) - 1)
                fork = tokens[:cut] + rng.choices(VOCAB, k=rng.randint(30, 200))
                full = cut // BLOCK
                ftable = table[:full]
                pool.incref(ftable)
                ftable += pool.allocate(pool.blocks_for(len(fork)) - full)
                checkpoint(tokens[:cut], table, now, frontier=False)  # the branch point's export
                checkpoint(fork, ftable, now, frontier=True)
                pool.free(ftable)
    for s in range(sessions):
        if s < sessions - running:
            pool.free(tables[s])
        else:  # still running: its hit path stays locked
            for n in tree.match(contexts[s] + [-1]).node.path():
                n.lock += 1
    return tree, now


def evict(tree: RadixTree, policy: Policy, index: EvictionIndex, node: Node) -> None:
    """As `CacheManager._evict`."""
    policy.on_evict(node, tree.exclusive_blocks(node) if node.is_leaf else 0)
    if node.slot is not None:
        node.slot, node.frontier = None, False
        index.slot_changed(node)
    while node.is_leaf and node.slot is None and node.lock == 0 and node.parent is not None:
        parent = node.parent
        tree.remove_leaf(node)
        node = parent


def run(tree: RadixTree, now: float, eviction: str, leaf_last: bool, kind: str, args) -> dict:
    policy = Policy(
        "flashstate",
        cost=PrefillCost(8e-6, 1e-11),
        bytes_per_block=786_432,
        bytes_per_slot=25_165_824,
        eviction=eviction,
        frontier=True,
        leaf_last=leaf_last,
        leaf_idle_seconds=60.0,
    )
    units = sum(1 for n in tree.nodes() if n.is_leaf or n.slot is not None)
    t0 = time.perf_counter()
    index = EvictionIndex(tree, policy)
    index.victim(kind, now)
    built = time.perf_counter() - t0
    picks, evictions = {"scan": [], "index": []}, []
    for how, count in (("scan", args.scan_victims), ("index", args.victims)):
        for _ in range(count):
            t0 = time.perf_counter()
            if how == "scan":
                node = scan_victim(policy, tree, kind, now)
            else:
                node = index.victim(kind, now)
            t1 = time.perf_counter()
            picks[how].append(t1 - t0)
            if how == "scan":
                assert index.victim(kind, now) is node, "the index disagrees with the scan"
            t1 = time.perf_counter()
            evict(tree, policy, index, node)
            evictions.append(time.perf_counter() - t1)
    scan, idx = statistics.mean(picks["scan"]), statistics.mean(picks["index"])
    return dict(
        policy=f"{eviction}{' leaf-last' if leaf_last else ''}",
        kind=kind,
        units=units,
        scan=scan,
        index=idx,
        speedup=scan / idx,
        build=built,
        evict=statistics.mean(evictions),
    )


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--prefixes", type=int, default=8)
    parser.add_argument("--running", type=int, default=64)
    parser.add_argument("--scan-victims", type=int, default=3)
    parser.add_argument("--victims", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t0 = time.perf_counter()
    tree, now = build(args.sessions, args.turns, args.prefixes, args.running, args.seed)
    nodes = sum(1 for _ in tree.nodes())
    print(f"tree: {nodes:,} nodes, built in {time.perf_counter() - t0:.1f} s")
    print()
    print("| policy | kind | units | scan s/victim | index s/victim | speed-up | index build s | eviction |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for eviction, leaf_last, kind in (("gds", True, "unit"), ("gds", True, "state"), ("lru", False, "kv")):
        r = run(tree, now, eviction, leaf_last, kind, args)
        print(
            f"| {r['policy']} | {r['kind']} | {r['units']:,} | {r['scan']:.3f} | {r['index'] * 1e6:.0f} µs"
            f" | {r['speedup']:,.0f}× | {r['build']:.2f} | {r['evict'] * 1e6:.0f} µs |",
            flush=True,
        )
    print()
    print(hook_cost(tree))


def hook_cost(tree: RadixTree, repeat: int = 2000) -> str:
    """What GDS's ref-count upkeep adds to a hit and a release: incref + free of the deepest path's blocks."""
    index = EvictionIndex(tree, Policy("flashstate", cost=PrefillCost(8e-6, 0), bytes_per_block=1,
                                       bytes_per_slot=1, eviction="gds"))  # fmt: skip
    index.victim("unit", 0.0)
    table = tree.block_table(max(tree.nodes(), key=lambda n: n.end))
    pool, seconds = tree.pool, {}
    for hooked in (True, False):
        pool.on_refs_changed = index._refs_changed if hooked else None
        t0 = time.perf_counter()
        for _ in range(repeat):
            pool.incref(table)
            pool.free(table)
            index.victim("unit", 0.0)
        seconds[hooked] = (time.perf_counter() - t0) / repeat
    return (
        f"a hit + release of a {len(table)}-block path, then a victim query: {seconds[True] * 1e6:.0f} µs"
        f" with the ref-count hook, {seconds[False] * 1e6:.0f} µs without"
    )


if __name__ == "__main__":
    main()
