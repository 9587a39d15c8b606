"""The cache manager's state machine (tests/cache/test_manager_state_machine.py) with the flashstate policy's
`auto` fallbacks under the shared budget: retry points, and spare exports at every multiple of 8 tokens,
taken only while they fit without evicting anything and evicted before any priced unit. The same
ownership invariants hold after every step (CacheManager.check_integrity also checks that every spare is
a checkpoint of the tree), and every hit restores a prefix that really was checkpointed."""

from hypothesis import HealthCheck, settings

from tests.cache.test_manager_state_machine import CacheMachine, _walk


class AutoMachine(CacheMachine):
    policy_name = "flashstate-shared"

    def __init__(self):
        super().__init__()
        policy = self.cache.policy
        policy.fallback_retry, policy.fallback_block, policy.fallback_spare = True, 8, True


TestFlashstateAuto = AutoMachine.TestCase
TestFlashstateAuto.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_the_auto_machine_takes_skips_hits_and_evicts_spares():
    """Not vacuous: spare exports are taken and skipped, spares are evicted as such, some are hit first
    (and become priced units), and priced evictions happen too."""
    machine = AutoMachine()
    for _ in _walk(machine, with_time=True):
        for seq in machine.running:
            if seq.cache_handle is not None and id(seq.cache_handle) in machine.cache._spare_nodes:
                raise AssertionError("a running sequence's hit is still a spare")
    skipped, taken = machine.cache.spare_exports
    ev = machine.cache.stats.evictions
    assert skipped > 20 and taken > 20, machine.cache.spare_exports
    assert ev["spare"] > 10 and ev["capacity_state"] + ev["capacity_kv"] > 10, ev
    assert taken > ev["spare"] + len(machine.cache._spare_nodes)  # the rest were hit (or landed on) first
