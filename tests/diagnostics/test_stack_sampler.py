import asyncio
import importlib.util
import os
import threading
import time

from flashstate import EngineConfig, SamplingParams
from flashstate.diagnostics import stack_sampler
from flashstate.diagnostics.stack_sampler import StackSampler
from flashstate.engine.async_engine import AsyncEngine


def _spin_in_marker(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def test_samples_name_the_function_a_thread_is_in():
    stop = threading.Event()
    worker = threading.Thread(target=_spin_in_marker, args=(stop,))
    worker.start()
    sampler = StackSampler(worker.ident, interval=0.001).start()
    deadline = time.monotonic() + 120  # only against a hang: a loaded machine takes what it takes
    while sampler.samples < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    stop.set()
    worker.join()
    assert sampler.samples >= 20
    assert sampler.inclusive["test_stack_sampler.py:_spin_in_marker"] >= 0.9 * sampler.samples
    report = sampler.report()
    assert "test_stack_sampler.py:_spin_in_marker" in report.split("innermost")[0]


def _sample(target, *args) -> StackSampler:
    stop = threading.Event()
    worker = threading.Thread(target=target, args=(*args, stop))
    worker.start()
    sampler = StackSampler(worker.ident, interval=0.001).start()
    deadline = time.monotonic() + 60  # a bound on a loaded machine, not a timing assertion
    while sampler.samples < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    stop.set()
    worker.join()
    return sampler


def test_a_checkout_folder_named_flashstate_does_not_name_its_files(tmp_path):
    """`git clone` makes a folder named like the package: a test file there is shown by its file name,
    not cut at the folder's name (flashstate/tests/...); the package's own files stay flashstate/…."""
    folder = tmp_path / "flashstate" / "tests" / "engine"
    folder.mkdir(parents=True)
    (folder / "spin_helper.py").write_text(
        "def spin(stop):\n    while not stop.is_set():\n        sum(range(1000))\n"
    )
    spec = importlib.util.spec_from_file_location("spin_helper", folder / "spin_helper.py")
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    sampler = _sample(helper.spin)
    assert sampler.inclusive["spin_helper.py:spin"] >= 0.9 * sampler.samples, sampler.inclusive
    assert stack_sampler._short(stack_sampler.__file__) == "flashstate/diagnostics/stack_sampler.py"
    assert stack_sampler._short(threading.__file__) == "threading.py"
    assert stack_sampler._short(asyncio.events.__file__) == "asyncio/events.py"


def test_the_engine_thread_writes_its_report_at_shutdown(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSTATE_STACK_SAMPLE", str(tmp_path / "stacks-%p.txt"))
    path = tmp_path / f"stacks-{os.getpid()}.txt"
    small = dict(max_num_batched_tokens=8, block_size=4)
    cost = (1e-5, 1e-8)  # no start-up calibration: it is not what this test is about
    eng = AsyncEngine(EngineConfig(model=tiny_model_dir, **small, prefill_cost_coefficients=cost))

    async def run():
        params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        async for _ in eng.generate(list(range(30)), params):
            pass

    asyncio.run(run())
    eng.shutdown()
    text = path.read_text()
    assert text.startswith("engine thread, cache policy flashstate, host tier None: ")
    assert "flashstate/engine/async_engine.py:_loop" in text  # every sample is inside the engine loop
