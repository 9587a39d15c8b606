import asyncio
import os
import threading
import time

from flashstate import EngineConfig, SamplingParams
from flashstate.engine.async_engine import AsyncEngine
from flashstate.engine.stack_sampler import StackSampler


def _spin_in_marker(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def test_samples_name_the_function_a_thread_is_in():
    stop = threading.Event()
    worker = threading.Thread(target=_spin_in_marker, args=(stop,))
    worker.start()
    sampler = StackSampler(worker.ident, interval=0.001).start()
    time.sleep(0.2)
    sampler.stop()
    stop.set()
    worker.join()
    assert sampler.samples > 10
    assert sampler.inclusive["test_stack_sampler.py:_spin_in_marker"] >= 0.9 * sampler.samples
    report = sampler.report()
    assert "test_stack_sampler.py:_spin_in_marker" in report.split("innermost")[0]


def test_the_engine_thread_writes_its_report_at_shutdown(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSTATE_STACK_SAMPLE", str(tmp_path / "stacks-%p.txt"))
    path = tmp_path / f"stacks-{os.getpid()}.txt"
    eng = AsyncEngine(EngineConfig(model=tiny_model_dir, max_num_batched_tokens=8, block_size=4))

    async def run():
        params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        async for _ in eng.generate(list(range(30)), params):
            pass

    asyncio.run(run())
    eng.shutdown()
    text = path.read_text()
    assert text.startswith("engine thread, cache policy flashstate, host tier None: ")
    assert "flashstate/engine/async_engine.py:_loop" in text  # every sample is inside the engine loop
