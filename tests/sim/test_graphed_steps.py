"""Graphed mixed steps in the simulator (--mixed-step-graphs): a step a MixedGraphs bucket takes costs the
profile's graphed_step_s instead of step_s; any other step is unchanged."""

import pytest

from flashstate.sim.command import engine_config, make_engines
from flashstate.sim.events import EventLoop
from flashstate.sim.profile import load_profile

SERVED = "h200-qwen3-next-2b-served"


def _first_step(prompt_tokens: int, graphs: bool | None) -> tuple[float, bool]:
    """(seconds, taken by a bucket) of the step that prefills a lone prompt (graphs None: the default)."""
    profile = load_profile(SERVED)
    flag = {True: ["--mixed-step-graphs"], False: ["--no-mixed-step-graphs"], None: []}[graphs]
    args = ["--kv-cache-memory-bytes", "2G", *flag]
    engine = make_engines(profile, engine_config(profile, args, "vllm"), 1, EventLoop())[0]
    engine.add("r", list(range(1, prompt_tokens + 1)), 4, seed=0)
    batch, seconds = engine.start_step()
    taken = engine.buckets is not None and engine.buckets.bucket(batch) is not None
    return seconds, taken


def test_a_short_prompts_step_costs_the_graphed_fixed_cost():
    profile = load_profile(SERVED)
    graphed, taken = _first_step(300, graphs=True)
    eager, _ = _first_step(300, graphs=False)
    assert taken
    assert eager - graphed == pytest.approx(profile.prefill_step_s - profile.graphed_step_s)
    assert _first_step(300, graphs=None) == (graphed, True)  # the default where the profile has the cost


def test_a_chunk_longer_than_any_bucket_runs_eagerly_as_before():
    graphed, taken = _first_step(3000, graphs=True)  # the largest bucket holds 2,048 tokens
    eager, _ = _first_step(3000, graphs=False)
    assert not taken and graphed == pytest.approx(eager)


def test_a_profile_without_the_graphed_cost_refuses_the_flag():
    profile = load_profile()  # the unserved H200 profile: no graphed_step_s
    assert profile.graphed_step_s is None
    assert make_engines(profile, engine_config(profile, [], "vllm"), 1, EventLoop())[0].buckets is None
    with pytest.raises(ValueError, match="graphed_step_s"):
        make_engines(profile, engine_config(profile, ["--mixed-step-graphs"], "vllm"), 1, EventLoop())
