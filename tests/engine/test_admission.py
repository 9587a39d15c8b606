"""Memory admission (engine/admission.py) on pools alone: the running set stays inside its share, mostly
cached prompts go first, an aged request is never passed over; and for every policy (flashstate with
memory admission, vllm and sglang with their own schedulers) any workload of agents' turns drains."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.cost import PrefillCost
from flashstate.cache.manager import CacheManager
from flashstate.cache.policy import Policy
from flashstate.cache.state_pool import StatePool
from flashstate.cache.vllm_pages import VllmPagePool
from flashstate.config import EngineConfig
from flashstate.engine.admission import MemoryAdmission
from flashstate.engine.scheduler import RequestTooLargeError, Scheduler, memory_admission
from flashstate.sampling_params import SamplingParams
from flashstate.sequence import RequestStats, Sequence

BLOCK = 4
COMMON = dict(cost=PrefillCost(1e-5, 1e-7), bytes_per_block=64, bytes_per_slot=256)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _policy(name: str) -> Policy:
    return {
        "flashstate": lambda: Policy(
            "flashstate", eviction="gds", frontier=True, prefill_export=True, **COMMON
        ),
        "vllm": lambda: Policy("vllm", checkpoint_block=8, decode_kv=True, **COMMON),
        "sglang": lambda: Policy("sglang", frontier=True, **COMMON),
    }[name]()


def _scheduler(name: str, clock: Clock, num_blocks=32, slots=10, max_num_seqs=4, budget=16, reserve=0.25,
               expected=8, max_wait=5.0, cold_reserve=0.0) -> Scheduler:  # fmt: skip
    pages = VllmPagePool(24, 8, num_state_groups=2, max_chunk_tokens=16) if name == "vllm" else None
    cache = CacheManager(
        BlockPool(num_blocks, BLOCK),
        StatePool(slots),
        _policy(name),
        max_checkpoints=slots - max_num_seqs,
        copy_block=lambda src, dst: None,
        clock=clock,
        pages=pages,
        byte_budget=num_blocks * 64 if name == "flashstate" else None,
    )
    admission = (
        MemoryAdmission(expected, reserve, max_wait, 1000, cold_reserve) if name == "flashstate" else None
    )
    flash = name == "flashstate"
    return Scheduler(
        cache, max_num_seqs, budget, 1000, arrivals_first=flash, admission=admission, preempt_checkpoint=flash
    )


def _seq(rid: str, tokens: list[int], max_tokens: int, now: float) -> Sequence:
    return Sequence(rid, list(tokens), SamplingParams(max_tokens=max_tokens), stats=RequestStats(now))


def _step(sched: Scheduler, clock: Clock, finished: list[Sequence]) -> None:
    batch = sched.schedule()
    tokens = [random.randrange(3) if batch.samples(i) else None for i in range(len(batch))]

    def stop(i, seq, token):
        done = len(seq.token_ids) - seq.num_prompt_tokens >= seq.params.max_tokens
        return _LENGTH if done else None

    for seq in sched.update_from_output(batch, tokens, stop):
        if seq.is_finished:
            finished.append(seq)
    clock.now += 1.0
    sched.check_integrity()


class _Finish:
    reason, stop_reason = "length", None


_LENGTH = _Finish()


def test_the_default_is_memory_admission_for_flashstate_alone():
    assert memory_admission(EngineConfig(cache_policy="flashstate"), 100) is not None
    assert memory_admission(EngineConfig(cache_policy="vllm"), 100) is None
    assert memory_admission(EngineConfig(cache_policy="sglang"), 100) is None
    assert memory_admission(EngineConfig(cache_policy="sglang", memory_admission=True), 100) is not None
    assert memory_admission(EngineConfig(memory_admission=False), 100) is None


def test_the_running_set_is_admitted_only_within_its_share():
    clock = Clock()
    # 32 blocks, reserve 0.25: the running set may grow into 24 blocks; each request expects 20 + 8 tokens
    # = 7 blocks, so three run and the fourth waits, though its first chunk alone would fit
    sched = _scheduler("flashstate", clock, max_num_seqs=8, budget=100)
    seqs = [_seq(str(i), [10 * i + j for j in range(20)], 8, 0.0) for i in range(4)]
    for s in seqs:
        sched.add(s)
    sched.schedule()
    assert [s.request_id for s in sched.running] == ["0", "1", "2"]
    assert [s.request_id for s in sched.waiting] == ["3"]
    assert sched.admission_blocked()


def test_a_mostly_cached_prompt_goes_before_an_earlier_uncached_one():
    clock = Clock()
    sched = _scheduler("flashstate", clock, max_num_seqs=1, budget=100)
    first = _seq("first", list(range(20)), 2, 0.0)
    sched.add(first)
    finished: list[Sequence] = []
    while not finished:
        _step(sched, clock, finished)
    cold = _seq("cold", [50 + i for i in range(20)], 2, clock.now)
    warm = _seq("warm", first.token_ids + [1, 2], 2, clock.now)  # the next turn: its prefix is cached
    sched.add(cold)
    sched.add(warm)
    sched.schedule()
    assert [s.request_id for s in sched.running] == ["warm"]
    assert warm.stats.num_cached_tokens > 0


def _cold_reserve_scene(clock: Clock, cold_reserve: float) -> tuple[Scheduler, Sequence, list[Sequence]]:
    """32 blocks, reserve 0.25 (the running set may grow into 24), cold reserve `cold_reserve`: a finished
    session "a" (cached), then "runner" (40 + 8 tokens: 12 blocks) running."""
    sched = _scheduler(
        "flashstate", clock, max_num_seqs=8, budget=100, max_wait=50.0, cold_reserve=cold_reserve
    )
    a = _seq("a", list(range(20)), 2, clock.now)
    sched.add(a)
    finished: list[Sequence] = []
    while not finished:
        _step(sched, clock, finished)
    sched.add(_seq("runner", [100 + i for i in range(40)], 8, clock.now))
    _step(sched, clock, finished)
    assert [s.request_id for s in sched.running] == ["runner"]
    return sched, a, finished


def _cold_after_a_step(clock: Clock, cold_reserve: float) -> tuple[Scheduler, Sequence, list, Sequence]:
    """`_cold_reserve_scene`, then a cold request (28 tokens: 7 blocks, nothing cached) added and a step."""
    sched, a, finished = _cold_reserve_scene(clock, cold_reserve)
    cold = _seq("cold", [200 + i for i in range(20)], 8, clock.now)
    sched.add(cold)
    _step(sched, clock, finished)
    return sched, a, finished, cold


def test_a_cold_prompt_leaves_the_cold_reserve_a_cached_one_does_not():
    clock = Clock()
    # cold reserve 0.5: a cold request may grow the running set into 16 blocks only; 12 + 7 > 16
    sched, a, finished, cold = _cold_after_a_step(clock, 0.5)
    assert cold in sched.waiting and sched.admission_blocked()
    warm = _seq("warm", a.token_ids + [1, 2], 8, clock.now)  # 22 + 2 + 8 = 32 tokens: 8 blocks, cached
    sched.add(warm)
    assert not sched.admission_blocked()
    _step(sched, clock, finished)
    assert warm in sched.running and warm.stats.num_cached_tokens > 0
    assert cold in sched.waiting
    # without the cold reserve the same cold request fits beside the runner (12 + 7 <= 24)
    sched2, _, _, cold2 = _cold_after_a_step(Clock(), 0.0)
    assert cold2 in sched2.running


def test_an_aged_cold_prompt_is_held_to_the_cache_reserve_alone():
    clock = Clock()
    sched, _, finished, cold = _cold_after_a_step(clock, 0.5)
    assert cold in sched.waiting
    clock.now += 50.0  # aged: 12 + 7 <= 24 blocks, the cold reserve no longer applies
    _step(sched, clock, finished)
    assert cold in sched.running or cold in finished


def test_an_aged_request_is_never_passed_over():
    clock = Clock()
    sched = _scheduler("flashstate", clock, max_num_seqs=8, budget=100, max_wait=3.0)
    big = _seq("big", list(range(64)), 8, 0.0)  # 18 blocks expected
    runner = _seq("runner", [100 + i for i in range(20)], 8, 0.0)  # 7 blocks
    finished: list[Sequence] = []
    sched.add(runner)
    _step(sched, clock, finished)
    sched.add(big)
    _step(sched, clock, finished)
    assert big in sched.waiting  # 7 + 17 > 24: waits
    clock.now = 4.0  # aged: smaller ones that would fit may no longer pass it
    small = _seq("small", [200 + i for i in range(4)], 2, clock.now)
    sched.add(small)
    _step(sched, clock, finished)
    assert small in sched.waiting and big in sched.waiting
    while big in sched.waiting:
        _step(sched, clock, finished)
    assert small in sched.waiting or small in finished or small in sched.running
    assert sched.stats.admission_blocked > 0


@st.composite
def workloads(draw):
    """Agents' turns: each a fresh prompt or a previous one extended, arriving at some step."""
    n = draw(st.integers(1, 14))
    rng = random.Random(draw(st.integers(0, 2**16)))
    requests = []
    for _ in range(n):
        if requests and rng.random() < 0.6:
            base = rng.choice(requests)[1]
            tokens = base + [rng.randrange(3) for _ in range(rng.randint(1, 30))]
        else:
            tokens = [rng.randrange(3) for _ in range(rng.randint(1, 60))]
        requests.append((rng.randint(0, 40), tokens[:100], rng.randint(1, 24)))
    return requests


MAX_STEPS = 5000


@settings(max_examples=60, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(["flashstate", "vllm", "sglang"]), work=workloads(), seed=st.integers(0, 99))
def test_every_admitted_workload_drains(name, work, seed):
    random.seed(seed)
    clock = Clock()
    sched = _scheduler(name, clock, num_blocks=40, max_num_seqs=3, budget=24, cold_reserve=0.55)
    pending = sorted(enumerate(work), key=lambda x: x[1][0])
    added, finished = [], []
    for _ in range(MAX_STEPS):
        while pending and pending[0][1][0] <= clock.now:
            i, (_, tokens, max_tokens) = pending.pop(0)
            seq = _seq(str(i), tokens, max_tokens, clock.now)
            try:
                sched.add(seq)
            except RequestTooLargeError:
                continue
            added.append(seq)
        if not pending and not sched.num_unfinished:
            break
        _step(sched, clock, finished)
        finished.extend(sched.failed)
        sched.failed.clear()
    else:
        raise AssertionError(f"{sched.num_unfinished} requests left after {MAX_STEPS} steps")
    assert {s.request_id for s in finished} == {s.request_id for s in added}
    for seq in finished:
        assert seq.finish_reason in ("length", "error")
        if seq.finish_reason == "length":
            assert len(seq.token_ids) - seq.num_prompt_tokens == seq.params.max_tokens
