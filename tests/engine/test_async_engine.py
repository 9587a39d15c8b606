import asyncio
import threading
import time

import pytest
import torch

import flashstate.engine.async_engine as async_engine
from flashstate import EngineConfig, SamplingParams
from flashstate.engine.async_engine import AsyncEngine
from flashstate.engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = AsyncEngine(EngineConfig(model=tiny_model_dir, max_num_batched_tokens=8, block_size=4))
    yield eng
    eng.shutdown()


def _full(engine):
    pools = engine.engine.cache
    engine.engine.check_integrity()
    engine.engine.reset_prefix_cache()
    return (
        pools.block_pool.num_free == pools.block_pool.num_blocks
        and pools.state_pool.num_free == pools.state_pool.num_slots
    )


def test_streams_concurrent_requests_token_by_token(engine):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    async def collect(prompt):
        deltas, last = [], None
        async for out in engine.generate(prompt, params):
            deltas.extend(out.delta_token_ids)
            last = out
        return deltas, last

    async def main():
        return await asyncio.gather(*(collect(list(range(i, i + 20))) for i in range(3)))

    results = asyncio.run(main())
    for deltas, last in results:
        assert last.finished and deltas == last.token_ids and len(deltas) == 6
    assert _full(engine)


def test_leaving_the_stream_aborts_and_frees(engine):
    params = SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True)

    async def main():
        seen = 0
        async for _ in engine.generate(list(range(40)), params):
            seen += 1
            if seen == 3:
                break  # the client went away
        await asyncio.sleep(0.05)
        return seen

    assert asyncio.run(main()) == 3
    assert engine.num_streams == 0 and not engine.engine.has_unfinished()
    assert _full(engine)


def test_bad_request_raises_before_queueing(engine):
    async def main():
        async for _ in engine.generate([engine.engine.spec.vocab_size + 1], SamplingParams()):
            pass

    with pytest.raises(ValueError, match="vocabulary"):
        asyncio.run(main())
    assert engine.num_streams == 0


class DeviceLikeModel(torch.nn.Module):
    """A forward like a GPU step's: launches that hold the GIL, then a device wait that frees it."""

    def __init__(self, model, seconds: float):
        super().__init__()
        self.spec, self.seconds = model.spec, seconds

    def forward(self, input_ids, meta):
        end = time.perf_counter() + self.seconds / 2
        while time.perf_counter() < end:
            pass
        time.sleep(self.seconds)
        return torch.zeros(input_ids.shape[0], self.spec.hidden_size)

    def compute_logits(self, hidden):
        return torch.zeros(hidden.shape[0], self.spec.vocab_size)


def test_requests_join_a_busy_engine_within_a_few_steps(tiny_model_dir):
    """While one request decodes step after step, each new one is admitted at the next step and done a
    few steps later: arrivals never wait for the engine to run dry. (With a lock around each step, as
    before the inbox, they waited 9–14 steps about two times in three.)"""
    llm = LLMEngine(
        EngineConfig(model=tiny_model_dir, max_num_batched_tokens=64, kv_cache_memory_bytes=64 << 20)
    )
    llm.runner.model = DeviceLikeModel(llm.model, 0.003)
    steps = [0]
    step = llm.step
    llm.step = lambda: steps.__setitem__(0, steps[0] + 1) or step()
    eng = AsyncEngine(engine=llm)
    long = SamplingParams(temperature=0.0, max_tokens=600, ignore_eos=True)
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)

    async def main():
        task = asyncio.create_task(_last(eng.generate(list(range(30)), long)))
        while steps[0] < 5:
            await asyncio.sleep(0.001)
        waited = []
        for i in range(5):
            before = steps[0]
            out = await _last(eng.generate(list(range(50 + i, 70 + i)), short))
            assert out.finished and len(out.token_ids) == 2
            waited.append(steps[0] - before)
        first = await task
        return waited, first

    try:
        waited, first = asyncio.run(main())
    finally:
        eng.shutdown()
    assert len(first.token_ids) == 600 and first.finished
    assert max(waited) <= 6, waited


async def _last(stream):
    return [out async for out in stream][-1]


def test_a_request_id_in_use_is_refused_and_the_first_keeps_running(engine):
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)

    async def main():
        first = engine.generate(list(range(30)), params, request_id="same")
        await first.__anext__()
        with pytest.raises(ValueError, match="already in use"):
            await engine.generate(list(range(30)), params, request_id="same").__anext__()
        return [o async for o in first][-1]

    out = asyncio.run(main())
    assert out.finished and len(out.token_ids) == 20
    assert _full(engine)


def test_a_consumer_that_falls_behind_gets_the_missed_steps_in_one_output(engine):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=0)

    async def main():
        outs = []
        async for out in engine.generate(list(range(12)), params):
            outs.append((out.delta_token_ids, out.delta_text, out.finished, out))
            if len(outs) == 2:
                await asyncio.sleep(0.5)  # the engine steps on meanwhile
        return outs

    outs = asyncio.run(main())
    final = outs[-1][3]
    assert final.finished and len(final.token_ids) == 40
    assert len(outs) < 40  # some outputs carried several steps
    assert max(len(ids) for ids, *_ in outs) > 1
    assert [t for ids, *_ in outs for t in ids] == final.token_ids
    assert "".join(text for _, text, *_ in outs) == final.text
    assert len(final.logprobs) == 40
    assert _full(engine)


def test_catching_up_keeps_the_text_of_a_request_with_stop_strings(engine):
    """Stop strings make the engine detokenise in the step loop (outputs carry their text): merged outputs
    still concatenate to the final text."""
    tok = engine.engine.tokenizer
    probe = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)

    async def run(params, lag):
        outs = []
        async for out in engine.generate(list(range(200, 215)), params):
            outs.append(out.delta_text)
            if lag and len(outs) == 1:
                await asyncio.sleep(0.5)
        return outs, out

    _, full = asyncio.run(run(probe, False))
    stop = tok.decode(full.token_ids[20:22])  # a string the greedy text reaches late
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop])
    deltas, last = asyncio.run(run(params, True))
    assert last.finished and last.finish_reason == "stop"
    assert "".join(deltas) == last.text and stop not in last.text
    assert len(deltas) < len(last.token_ids)
    assert _full(engine)


def test_the_engine_is_built_on_its_own_thread_and_a_failed_build_raises_here(
    tiny_model_dir, tmp_path, monkeypatch
):

    built_on = []

    class Recording(LLMEngine):
        def __init__(self, config):
            built_on.append(threading.current_thread().name)
            super().__init__(config)

    monkeypatch.setattr(async_engine, "LLMEngine", Recording)
    eng = AsyncEngine(EngineConfig(model=tiny_model_dir))
    eng.shutdown()
    assert built_on == ["flashstate-engine"]  # where it steps: no second thread's torch ops on the CPU
    with pytest.raises(FileNotFoundError, match="does not exist"):
        AsyncEngine(EngineConfig(model=str(tmp_path / "missing")))
