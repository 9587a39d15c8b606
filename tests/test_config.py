import pytest

from flashstate.config import EngineConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"state_cache_fraction": 1.0}, "state_cache_fraction must be in"),
        ({"state_cache_fraction": -0.1}, "state_cache_fraction must be in"),
        ({"mamba_checkpoint_placement": "block"}, "must be asc or aligned"),
        ({"mamba_checkpoint_placement": "aligned", "cache_policy": "sglang"}, "for the flashstate policy"),
        ({"cache_policy": "vllm", "prefix_cache_eviction": "gds"}, "no gds"),
    ],
)
def test_bad_cache_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)


def test_the_policy_defaults_validate():
    assert EngineConfig().state_cache_fraction is None
    assert EngineConfig(mamba_checkpoint_placement="aligned").mamba_checkpoint_placement == "aligned"


def test_mixed_steps_are_graphed_by_default_wherever_decode_steps_are():
    assert EngineConfig().graphs_mixed_steps(graphs=True)
    assert not EngineConfig().graphs_mixed_steps(graphs=False)  # the CPU: no CUDA graphs
    assert not EngineConfig(enforce_eager=True).graphs_mixed_steps(graphs=True)
    assert EngineConfig(enforce_eager=True, mixed_step_graphs=True).graphs_mixed_steps(graphs=True)
    assert EngineConfig(mixed_step_graphs=True).graphs_mixed_steps(graphs=False)  # padded, eager: for tests
    assert not EngineConfig(mixed_step_graphs=False).graphs_mixed_steps(graphs=True)


def test_reserved_working_slots_are_the_flashstate_shared_budgets_alone():
    for kwargs in ({"cache_policy": "vllm"}, {"state_cache_fraction": 0.5}, {"enable_prefix_caching": False}):
        with pytest.raises(ValueError, match="reserve_working_slots"):
            EngineConfig(reserve_working_slots=True, **kwargs)
    assert EngineConfig(reserve_working_slots=True).reserve_working_slots
