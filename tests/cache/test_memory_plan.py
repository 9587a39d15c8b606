from pathlib import Path

import pytest
import torch

from flashstate.cache.memory_plan import plan_cache
from flashstate.config import EngineConfig
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.model_spec import ModelSpec

BUDGET = 256 << 20


@pytest.fixture(scope="module")
def spec(tiny_model_dir) -> ModelSpec:
    return spec_from_hf(Path(tiny_model_dir) / "config.json")


def _plan(spec, budget=BUDGET, physical_limit=False, **kw):
    return plan_cache(spec, EngineConfig(max_num_seqs=4, **kw), torch.float32, budget, physical_limit)


def test_flashstate_shares_one_budget_between_working_states_blocks_and_checkpoints(spec):
    plan = _plan(spec)
    assert plan.shared_bytes == BUDGET and plan.working_charged
    # either pool alone could take the whole budget (every slot in use is charged: no more slots than it buys)
    assert plan.num_blocks == BUDGET // plan.bytes_per_block
    assert plan.num_slots == plan.max_checkpoints == BUDGET // plan.bytes_per_slot
    assert "working states of the running requests" in plan.describe()
    # a budget too small for max_num_seqs working states still serves fewer at a time
    small = _plan(spec, budget=3 * plan.bytes_per_slot + plan.bytes_per_block)
    assert small.shared_bytes == 3 * plan.bytes_per_slot + plan.bytes_per_block


def test_reserved_working_slots_leave_the_rest_to_blocks_and_checkpoints(spec):
    plan = _plan(spec, reserve_working_slots=True)
    working = 4 * plan.bytes_per_slot
    assert plan.shared_bytes == BUDGET - working and not plan.working_charged
    # either pool alone could take the whole shared budget
    assert plan.num_blocks == plan.shared_bytes // plan.bytes_per_block
    assert plan.num_slots - plan.num_working_slots == plan.shared_bytes // plan.bytes_per_slot
    assert "4 working state slots" in plan.describe()
    with pytest.raises(ValueError, match="cannot hold 4 working states"):
        _plan(spec, budget=3 * plan.bytes_per_slot + plan.bytes_per_block, reserve_working_slots=True)


def test_sglang_and_an_explicit_fraction_split_the_budget(spec):
    for plan, fraction in (
        (_plan(spec, cache_policy="sglang"), 0.25),
        (_plan(spec, state_cache_fraction=0.5), 0.5),
    ):
        assert plan.shared_bytes is None
        left = BUDGET - 4 * plan.bytes_per_slot
        assert plan.num_slots - 4 == int(left * fraction) // plan.bytes_per_slot
        assert plan.physical_bytes <= BUDGET


def test_no_prefix_caching_keeps_no_checkpoint_slots(spec):
    plan = _plan(spec, cache_policy="none")
    assert plan.num_slots == 4 and plan.shared_bytes is None


@pytest.mark.parametrize("policy", ["flashstate", "vllm"])
def test_a_physical_limit_shrinks_the_over_provisioned_plans_to_fit(spec, policy):
    loose = _plan(spec, cache_policy=policy)
    assert loose.physical_bytes > BUDGET  # over-provisioned: the accounting binds, not the pools
    tight = _plan(spec, cache_policy=policy, physical_limit=True)
    assert tight.physical_bytes <= BUDGET < 2 * tight.physical_bytes


def test_on_a_card_flashstate_accounts_two_thirds_of_what_the_weights_leave(spec):
    # Under a physical limit its checkpoint slots take at most half the shared budget, so blocks for the
    # whole of it and those slots fit: 1 / 1.5 of the memory is accounted, not half of it.
    plan = _plan(spec, cache_policy="flashstate", physical_limit=True)
    checkpoints = plan.num_slots - plan.num_working_slots
    assert plan.physical_bytes <= BUDGET
    assert plan.num_blocks == plan.shared_bytes // plan.bytes_per_block
    assert 1 <= checkpoints <= max(plan.shared_bytes // 2 // plan.bytes_per_slot, 1)
    assert plan.shared_bytes + 4 * plan.bytes_per_slot > 0.6 * BUDGET
