"""The eviction index picks exactly the victim a scan of the whole tree picks (`scan_victim`, the first
node in tree order with the smallest key), for every policy, victim kind and exclusion, through random
inserts (with splits and salts), hits, checkpoints set and evicted, locks, sequences taking and dropping
block references, and time going forward (and back)."""

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.cost import PrefillCost
from flashstate.cache.eviction_index import KINDS, EvictionIndex, scan_victim
from flashstate.cache.manager import CacheManager
from flashstate.cache.policy import Policy
from flashstate.cache.tree import Node, RadixTree, precedes
from tests.cache.test_manager_state_machine import CacheMachine, _walk

BLOCK = 4
POLICIES = [("gds", True), ("gds", False), ("lru", True), ("lru", False)]
ACTIONS = ["insert", "finish", "hit", "checkpoint", "lock", "unlock", "share", "evict", "evict_any", "time"]


class IndexMachine(RuleBasedStateMachine):
    """The tree, the block pool and the index driven directly, as the cache manager drives them."""

    eviction = "gds"
    leaf_last = True

    def __init__(self):
        super().__init__()
        self.pool = BlockPool(160, BLOCK)
        self.tree = RadixTree(self.pool)
        self.policy = Policy(
            "flashstate",
            cost=PrefillCost(1e-5, 1e-7),
            bytes_per_block=64,
            bytes_per_slot=256,
            eviction=self.eviction,
            frontier=True,
            leaf_last=self.leaf_last,
            leaf_idle_seconds=3.0,
        )
        self.index = EvictionIndex(self.tree, self.policy)
        self.now = 0.0
        self.tables: list[list[int]] = []  # block tables of running sequences: a reference on each block
        self.handles: list[Node] = []  # locked paths (running sequences' hits)
        self.contexts: list[tuple[str | None, list[int]]] = []
        self.slots = 0
        self.victims = 0

    # ---- helpers (what the manager does) --------------------------------------------------------

    def _nodes(self) -> list[Node]:
        return list(self.tree.nodes())

    def _victim(self, kind: str, exclude: Node | None = None) -> Node | None:
        got = self.index.victim(kind, self.now, exclude)
        want = scan_victim(self.policy, self.tree, kind, self.now, exclude)
        assert got is want, (kind, exclude, got, want)
        self.victims += got is not None
        return got

    def _stamp(self, node: Node) -> None:
        self.policy.stamp(node, self.now)
        self.index.touched(node)

    def _lock(self, node: Node, delta: int) -> None:
        for n in node.path():
            n.lock += delta
            if n.lock == 0 or n.lock == delta:
                self.index.lock_changed(n)

    def _evict(self, node: Node) -> None:
        self.policy.on_evict(node, self.tree.exclusive_blocks(node) if node.is_leaf else 0)
        if node.slot is not None:
            node.slot, node.frontier = None, False
            self.index.slot_changed(node)
        while node.is_leaf and node.slot is None and node.lock == 0 and node.parent is not None:
            parent = node.parent
            self.tree.remove_leaf(node)
            node = parent

    def _blocks(self, n: int) -> list[int] | None:
        while self.pool.num_free < n:
            victim = self._victim("kv")
            if victim is None:
                return None
            self._evict(victim)
        return self.pool.allocate(n)

    # ---- rules ----------------------------------------------------------------------------------

    @rule(
        seed=st.integers(0, 2**16),
        how=st.sampled_from(["fresh", "extend", "fork", "again"]),
        salt=st.sampled_from([None, None, "s"]),
        checkpoint=st.booleans(),
        frontier=st.booleans(),
        keep=st.booleans(),
    )
    def insert(self, seed, how, salt, checkpoint, frontier, keep):
        """A sequence shares the cached full blocks of its path, writes the rest and leaves a path (with a
        checkpoint, or KV only) at some depth; it keeps its references (running) or drops them."""
        rng = random.Random(seed)
        if how == "fresh" or not self.contexts:
            tokens = [rng.randrange(3) for _ in range(rng.randint(1, 24))]
        else:
            salt, base = rng.choice(self.contexts)
            if how == "extend":
                tokens = base + [rng.randrange(3) for _ in range(rng.randint(1, 12))]
            elif how == "fork":
                cut = rng.randint(1, len(base))
                tokens = base[:cut] + [rng.randrange(3) for _ in range(rng.randint(1, 9))]
            else:
                tokens = list(base)
        depth = rng.randint(1, len(tokens))
        kv = self.tree.match(tokens, salt=salt).kv_depth // BLOCK * BLOCK
        shared = self.tree.kv_blocks(tokens, kv, salt)
        self.pool.incref(shared)
        own = self._blocks(self.pool.blocks_for(len(tokens)) - len(shared))
        if own is None:
            self.pool.free(shared)
            return
        table = shared + own
        node, _ = self.tree.insert(tokens, table, depth, salt)
        if checkpoint and node.slot is None:
            self.slots += 1
            node.slot, node.frontier = self.slots, frontier
            self.index.slot_changed(node)
        self._stamp(node)
        self.contexts.append((salt, tokens[:depth]))
        if keep:
            self.tables.append(table)
        else:
            self.pool.free(table)

    @rule(i=st.integers(0, 99))
    def finish(self, i):
        if self.tables:
            self.pool.free(self.tables.pop(i % len(self.tables)))

    @rule(i=st.integers(0, 999), frontier=st.booleans())
    def hit(self, i, frontier):
        nodes = self._nodes()
        if nodes:
            node = nodes[i % len(nodes)]
            node.frontier |= frontier and node.slot is not None
            self._stamp(node)

    @rule(i=st.integers(0, 999), frontier=st.booleans())
    def checkpoint(self, i, frontier):
        nodes = [n for n in self._nodes() if n.slot is None]
        if nodes:
            node = nodes[i % len(nodes)]
            self.slots += 1
            node.slot, node.frontier = self.slots, frontier
            self.index.slot_changed(node)
            self._stamp(node)

    @rule(i=st.integers(0, 999))
    def lock(self, i):
        nodes = self._nodes()
        if nodes:
            node = nodes[i % len(nodes)]
            self._lock(node, +1)
            self.handles.append(node)

    @rule(i=st.integers(0, 99))
    def unlock(self, i):
        if self.handles:
            self._lock(self.handles.pop(i % len(self.handles)), -1)

    @rule(i=st.integers(0, 999))
    def share(self, i):
        """A running sequence takes references on a cached path's blocks (a hit)."""
        nodes = self._nodes()
        if nodes:
            table = self.tree.block_table(nodes[i % len(nodes)])
            self.pool.incref(table)
            self.tables.append(table)

    @rule(kind=st.sampled_from(sorted(KINDS)), i=st.integers(0, 999), exclude=st.booleans())
    def evict(self, kind, i, exclude):
        nodes = self._nodes()
        victim = self._victim(kind, nodes[i % len(nodes)] if exclude and nodes else None)
        if victim is not None:
            self._evict(victim)

    @rule(i=st.integers(0, 999))
    def evict_any(self, i):
        """A checkpoint lost however (the vLLM pool, a refused admission): not the index's choice."""
        nodes = [n for n in self._nodes() if n.slot is not None]
        if nodes:
            self._evict(nodes[i % len(nodes)])

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.9, 3.0, 4.0, 10.0, -0.5, -4.0]))
    def time_passes(self, dt):
        self.now += dt

    @rule(kind=st.sampled_from(sorted(KINDS)), i=st.integers(0, 999), exclude=st.booleans())
    def query(self, kind, i, exclude):
        nodes = self._nodes()
        self._victim(kind, nodes[i % len(nodes)] if exclude and nodes else None)

    @invariant()
    def tree_order(self):
        """`precedes` is the order of `nodes()`."""
        nodes = self._nodes()
        for a, b in zip(nodes, nodes[1:], strict=False):
            assert precedes(a, b) and not precedes(b, a)


def _machine(eviction: str, leaf_last: bool) -> type[IndexMachine]:
    fields = {"eviction": eviction, "leaf_last": leaf_last}
    return type(f"Index_{eviction}_{leaf_last}", (IndexMachine,), fields)


def _case(eviction: str, leaf_last: bool):
    case = _machine(eviction, leaf_last).TestCase
    case.settings = settings(
        max_examples=80, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    return case


TestIndexGds = _case("gds", True)
TestIndexGdsNoLeafLast = _case("gds", False)
TestIndexLru = _case("lru", True)
TestIndexLruNoLeafLast = _case("lru", False)


@pytest.mark.parametrize("eviction,leaf_last", POLICIES)
def test_long_random_walks_agree_with_the_scan(eviction, leaf_last):
    """Seeded walks, long enough for big trees, many stale entries (compaction) and protection expiring;
    after each step every kind's victim, with and without an exclusion, is the scan's."""
    for seed in range(6):
        rng = random.Random(seed)
        m = _machine(eviction, leaf_last)()
        for _ in range(600):
            action = rng.choices(ACTIONS, [8, 3, 4, 2, 2, 2, 1, 3, 1, 2])[0]
            if action == "insert":
                m.insert(
                    rng.randrange(2**16),
                    rng.choice(["fresh", "extend", "extend", "fork", "again"]),
                    rng.choice([None, None, "s"]),
                    rng.random() < 0.8,
                    rng.random() < 0.5,
                    rng.random() < 0.3,
                )
            elif action == "finish":
                m.finish(rng.randrange(99))
            elif action in ("hit", "checkpoint"):
                getattr(m, action)(rng.randrange(999), rng.random() < 0.5)
            elif action in ("lock", "unlock", "share", "evict_any"):
                getattr(m, action)(rng.randrange(999))
            elif action == "evict":
                m.evict(rng.choice(sorted(KINDS)), rng.randrange(999), rng.random() < 0.3)
            else:
                m.time_passes(rng.choice([0.0, 0.5, 1.0, 3.0, 4.0, -1.0]))
            nodes = m._nodes()
            for kind in KINDS:
                m.query(kind, 0, False)
                if nodes:
                    m.query(kind, rng.randrange(len(nodes)), True)
        assert m.victims > 200 and m.index._entries <= 4 * len(m.index._records) + 1024


# ---- through the cache manager ------------------------------------------------------------------


def _checked(cache: CacheManager) -> None:
    """Every victim the manager asks for is checked against the scan, for every kind and exclusion."""
    if cache.index is None:
        return
    chosen = cache._victim

    def victim(kind: str, exclude: Node | None = None) -> Node | None:
        now = cache.clock()
        for k in KINDS:
            for e in {None, exclude}:
                want = scan_victim(cache.policy, cache.tree, k, now, e)
                assert cache.index.victim(k, now, e) is want, (k, e)
        return chosen(kind, exclude)

    cache._victim = victim


class CheckedCacheMachine(CacheMachine):
    def __init__(self):
        super().__init__()
        _checked(self.cache)


def _manager_case(name: str):
    case = type(f"Checked_{name}", (CheckedCacheMachine,), {"policy_name": name}).TestCase
    case.settings = settings(
        max_examples=30, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    return case


TestManagerFlashstate = _manager_case("flashstate")
TestManagerFlashstateShared = _manager_case("flashstate-shared")
TestManagerFlashstateLRU = _manager_case("flashstate-lru")
TestManagerVllm = _manager_case("vllm")
TestManagerSglang = _manager_case("sglang")


@pytest.mark.parametrize("name", ["flashstate", "flashstate-shared", "vllm"])
def test_manager_walk_agrees_with_the_scan(name):
    machine = type(f"Checked_{name}_walk", (CheckedCacheMachine,), {"policy_name": name})()
    for _ in _walk(machine, with_time=name != "vllm", steps=1500):
        pass
    assert sum(machine.cache.stats.evictions.values()) > 20
