"""The engine's async scheduling in the simulator: while a pure decode step runs, the engine has already
launched the step after it (LLMEngine._next_decode) when nothing waiting could be admitted, so a request
arriving during the step waits one step more than a synchronous engine would make it wait."""

import pytest

from flashstate.sim.command import engine_config, make_engines
from flashstate.sim.events import EventLoop
from flashstate.sim.profile import load_profile


def _steps_until_admitted(flags: list[str]) -> int:
    """Steps after the one a request arrives in until the engine schedules it (a lone decoding request)."""
    profile = load_profile("h200-qwen3-next-2b-served")
    loop = EventLoop()
    args = ["--kv-cache-memory-bytes", "4G", "--max-num-seqs", "8", *flags]
    config = engine_config(profile, args, "flashstate")
    engine = make_engines(profile, config, 1, loop)[0]
    engine.add("a", list(range(1, 200)), 50, seed=0)
    batch, _ = engine.start_step()  # a's prefill, then its first decode step
    engine.finish_step(batch)
    batch, _ = engine.start_step()
    assert all(n == 1 for n in batch.num_tokens)
    engine.add("b", list(range(1, 100)), 5, seed=1)  # arrives while that decode step runs
    engine.finish_step(batch)
    for steps in range(1, 5):
        batch, _ = engine.start_step()
        engine.finish_step(batch)
        if any(s.request_id == "b" for s in batch.seqs):
            return steps
    raise AssertionError("b was never scheduled")


@pytest.mark.parametrize("flags, steps", [([], 2), (["--no-async-scheduling"], 1), (["--enforce-eager"], 1)])
def test_an_arrival_during_a_pipelined_decode_step_waits_for_the_step_launched_ahead(flags, steps):
    assert _steps_until_admitted(flags) == steps
