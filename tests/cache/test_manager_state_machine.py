"""Property-based state machine over the cache manager, for every policy: random agents' turns, forks,
resends, chunked prefills with exports, preemption, aborts and memory pressure. After every step the
ownership invariants hold, and every hit restores a prefix that really was checkpointed."""

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.cost import PrefillCost
from flashstate.cache.manager import CacheManager
from flashstate.cache.policy import Policy
from flashstate.cache.state_pool import StatePool
from flashstate.cache.vllm_pages import VllmPagePool
from flashstate.sampling_params import SamplingParams
from flashstate.sequence import Sequence

BLOCK = 4
PARAMS = SamplingParams(max_tokens=4)


def _policy(name: str) -> Policy | None:
    common = dict(cost=PrefillCost(1e-5, 1e-7), bytes_per_block=64, bytes_per_slot=256)
    return {
        "flashstate": lambda: Policy(
            "flashstate",
            eviction="gds",
            frontier=True,
            prefill_export=True,
            leaf_last=True,
            leaf_idle_seconds=3.0,
            **common,
        ),
        "flashstate-shared": lambda: _policy("flashstate"),
        "flashstate-charged": lambda: _policy("flashstate"),
        "flashstate-lru": lambda: Policy(
            "flashstate", eviction="lru", frontier=True, prefill_export=True, **common
        ),
        "vllm": lambda: Policy("vllm", checkpoint_block=8, decode_kv=True, **common),
        "sglang": lambda: Policy("sglang", frontier=True, **common),
        "none": lambda: None,
    }[name]()


class CacheMachine(RuleBasedStateMachine):
    policy_name = "flashstate"

    def __init__(self):
        super().__init__()
        self.now = 0.0
        # vllm: an emulated vLLM pool (2 state groups + attention, pages of 8 tokens) decides hits.
        pages = VllmPagePool(24, 8, num_state_groups=2, max_chunk_tokens=16)
        # flashstate-shared: 28 blocks' worth of bytes buys blocks and checkpoints (a slot costs 4 blocks);
        # either physical pool could take the whole of it, so only the charge binds. flashstate-charged:
        # the same bytes buy the running sequences' working slots too (6 of them, beside 7 checkpoints).
        shared = self.policy_name in ("flashstate-shared", "flashstate-charged")
        charged = self.policy_name == "flashstate-charged"
        self.cache = CacheManager(
            BlockPool(28, BLOCK),
            StatePool(13 if charged else 14 if shared else 10),
            _policy(self.policy_name),
            max_checkpoints=7 if shared else 6,
            copy_block=lambda src, dst: None,
            clock=lambda: self.now,
            pages=pages if self.policy_name == "vllm" else None,
            byte_budget=28 * 64 if shared else None,
            working_charged=charged,
        )
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.contexts: list[list[int]] = []  # finished requests' tokens: the agents' histories
        self.committed: set[tuple[int, ...]] = set()
        self.ids = 0
        self.num_exports = 0

    def _seq(self, tokens: list[int]) -> Sequence:
        self.ids += 1
        return Sequence(str(self.ids), tokens, PARAMS)

    @rule(seed=st.integers(0, 2**16), kind=st.sampled_from(["fresh", "next_turn", "fork", "resend"]))
    def new_request(self, seed, kind):
        rng = random.Random(seed)
        if kind == "fresh" or not self.contexts:
            tokens = [rng.randrange(3) for _ in range(rng.randint(1, 20))]
        else:
            base = rng.choice(self.contexts)
            if kind == "next_turn":
                tokens = base + [rng.randrange(3) for _ in range(rng.randint(1, 12))]
            elif kind == "fork":
                tokens = base[: rng.randint(1, len(base))] + [
                    rng.randrange(3) for _ in range(rng.randint(1, 9))
                ]
            else:
                tokens = list(base)
        if self.cache.can_ever_fit(len(tokens) + PARAMS.max_tokens):
            self.waiting.append(self._seq(tokens))

    @precondition(lambda self: self.waiting and len(self.running) < 6)
    @rule()
    def admit(self):
        seq = self.waiting[0]
        if not self.cache.admit(seq):
            return
        self.waiting.pop(0)
        self.cache.record_admission(seq)
        depth = seq.num_computed_tokens
        assert depth <= len(seq.token_ids) - 1
        if depth:
            assert tuple(seq.token_ids[:depth]) in self.committed, "hit on a prefix never checkpointed"
        self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 5), n=st.integers(1, 9), token=st.integers(0, 2))
    def step(self, i, n, token):
        seq = self.running[i % len(self.running)]
        n = min(n, seq.num_uncomputed)
        while not self.cache.allocate(seq, n):
            # as the scheduler: preempt the newest running sequence (recomputed later from its possibly
            # cached prefix), then try again unless that was this one
            victim = self.running.pop()
            self.cache.release(victim, commit=False)
            victim.num_computed_tokens = 0
            self.waiting.insert(0, victim)
            if victim is seq:
                return
        exports = self.cache.exports(seq, n)
        self.num_exports += len(exports)
        start = seq.num_computed_tokens
        for count, slot in exports:
            self.cache.commit_export(seq, start + count, slot)
            if self.cache.enabled:
                self.committed.add(tuple(seq.token_ids[: start + count]))
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == len(seq.token_ids):
            seq.token_ids.append(token)  # sampled

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 5), commit=st.booleans())
    def finish(self, i, commit):
        seq = self.running.pop(i % len(self.running))
        depth = seq.num_computed_tokens
        if commit and depth and self.cache.enabled and self.cache.policy.frontier:
            self.committed.add(tuple(seq.token_ids[:depth]))
        self.cache.release(seq, commit=commit)
        if commit and depth:
            self.contexts.append(seq.token_ids[:depth])

    @rule(blocks=st.integers(1, 28))
    def pressure(self, blocks):
        """A burst that wants many blocks: evicts cache units, never running sequences' blocks."""
        hog = self._seq([0] * (blocks * BLOCK))
        if self.cache.admit(hog):
            hog.num_computed_tokens = 0
            hog.block_table, keep = [], list(hog.block_table)
            self.cache.block_pool.free(keep)
            if self.cache.allocate(hog, blocks * BLOCK):
                assert len(hog.block_table) == blocks
            self.cache.release(hog, commit=False)

    @rule(dt=st.floats(0.1, 5.0))
    def time_passes(self, dt):
        self.now += dt

    @invariant()
    def integrity(self):
        self.cache.check_integrity(self.running)
        evictions = self.cache.stats.evictions
        if self.cache.pages is not None and not (evictions["capacity_kv"] or evictions["capacity_state"]):
            # Until the tree's own (small) pools evict, it holds every state the vLLM pool offers.
            assert evictions["vllm_pool_divergence"] == 0
        for seq in self.running:
            assert len(seq.block_table) * BLOCK >= seq.num_computed_tokens


def _case(name: str):
    machine = type(f"Machine_{name}", (CacheMachine,), {"policy_name": name})
    case = machine.TestCase
    case.settings = settings(
        max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    return case


TestFlashstate = _case("flashstate")
TestFlashstateShared = _case("flashstate-shared")
TestFlashstateCharged = _case("flashstate-charged")
TestFlashstateLRU = _case("flashstate-lru")
TestVllm = _case("vllm")
TestSglang = _case("sglang")
TestNone = _case("none")


def _walk(machine: CacheMachine, with_time: bool, steps: int = 3000):
    """A seeded random walk over the machine's rules, checking its invariants after each step (yields
    once per step)."""
    rng = random.Random(0)
    actions = ["new", "new", "admit", "step", "step", "step", "finish", "pressure"] + ["time"] * with_time
    for _ in range(steps):
        action = rng.choice(actions)
        if action == "new":
            machine.new_request(rng.randrange(2**16), rng.choice(["fresh", "next_turn", "fork", "resend"]))
        elif action == "admit" and machine.waiting and len(machine.running) < 6:
            machine.admit()
        elif action == "step" and machine.running:
            machine.step(rng.randrange(6), rng.randint(1, 9), rng.randrange(3))
        elif action == "finish" and machine.running:
            machine.finish(rng.randrange(6), rng.random() < 0.9)
        elif action == "pressure":
            machine.pressure(rng.randint(1, 28))
        elif action == "time":
            machine.time_passes(rng.uniform(0.1, 5.0))
        machine.integrity()
        yield


@pytest.mark.parametrize("name", ["flashstate", "flashstate-shared", "flashstate-charged"])
def test_the_machine_reaches_hits_evictions_and_exports(name):
    """Guard against a vacuous machine: a seeded random walk over the same rules sees hits, evictions of
    both kinds, refusals and exports (with the shared budget: the charge reaches the budget, and blocks
    and checkpoints take turns holding it)."""
    machine = type(f"Machine_{name}_walk", (CacheMachine,), {"policy_name": name})()
    most_checkpoints, most_blocks = 0, 0
    for _ in _walk(machine, with_time=True):
        pool = machine.cache.block_pool
        most_checkpoints = max(most_checkpoints, machine.cache.num_checkpoints)
        most_blocks = max(most_blocks, pool.num_blocks - pool.num_free)
    if name == "flashstate-shared":
        # 7 checkpoints, or 28 blocks, would fill the budget alone: at times checkpoints hold 20 blocks'
        # worth of it, at other times KV holds 24 blocks
        assert most_checkpoints >= 5 and most_blocks >= 24, (most_checkpoints, most_blocks)
    s = machine.cache.stats
    assert s.hits > 20 and s.evictions["capacity_kv"] > 5 and s.evictions["capacity_state"] > 5, s
    # (with the working slots charged, six running sequences' slots take most of the budget: units are
    # evicted for them before the admission rule has a unit to refuse)
    assert (s.admissions_refused > 0 or name == "flashstate-charged") and machine.num_exports > 20


def test_the_vllm_machine_reaches_hits_and_pool_evictions():
    """The vllm machine is not vacuous either: its emulated page pool gives hits and evicts states."""
    machine = type("Machine_vllm_walk", (CacheMachine,), {"policy_name": "vllm"})()
    for _ in _walk(machine, with_time=False):
        pass
    s = machine.cache.stats
    assert s.hits > 10 and s.evictions["vllm_pool"] > 5 and machine.cache.pages.num_evicted > 20, s
