import sys
import threading
import time

import pytest

from flashstate.diagnostics.thread_cpu import describe, thread_cpu_seconds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_busy_thread_is_charged_its_cpu_seconds_and_an_idle_one_none():
    stop = threading.Event()

    def spin() -> None:
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        stop.wait()

    busy = threading.Thread(target=spin, name="busy-spinner")
    idle = threading.Thread(target=stop.wait, name="idle-waiter")
    busy.start(), idle.start()
    time.sleep(0.05)
    deadline = time.monotonic() + 10
    while thread_cpu_seconds().get("busy-spinner", 0) < 0.25 and time.monotonic() < deadline:
        time.sleep(0.05)
    seconds = thread_cpu_seconds()
    stop.set()
    busy.join(), idle.join()
    assert seconds["busy-spinner"] >= 0.25
    assert seconds["idle-waiter"] < 0.1
    assert "MainThread" in seconds


def test_describe_ranks_the_busiest_and_sums_the_rest():
    text = describe({"a": 1.0, "b": 5.0, "c": 0.5, "d": 0.25}, top=2)
    assert text == "b 5.0 s, a 1.0 s, 2 others 0.8 s"
