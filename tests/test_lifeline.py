"""Children die with their parent (PR_SET_PDEATHSIG), started from a thread that lasts; SIGTERM unwinds."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from flashstate.lifeline import in_lasting_thread, preexec_die_with_parent
from tests.processes import alive, kill_all, wait_gone

EXIT_BOUND_S = 30.0  # a generous bound on a loaded machine, not a timing claim
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], preexec_fn=preexec_die_with_parent(signal.SIGKILL))


def _started_on_a_thread_that_ends(start) -> subprocess.Popen:
    box = []
    thread = threading.Thread(target=lambda: box.append(start()))
    thread.start()
    thread.join()
    task = Path(f"/proc/self/task/{thread.native_id}")
    deadline = time.monotonic() + EXIT_BOUND_S
    while task.exists() and time.monotonic() < deadline:  # the kernel's side of the thread's exit
        time.sleep(0.01)
    return box[0]


@linux
def test_a_child_dies_when_its_parent_is_killed():
    script = textwrap.dedent("""
        import signal, subprocess, sys, time
        from flashstate.lifeline import preexec_die_with_parent
        child = subprocess.Popen(["sleep", "300"], preexec_fn=preexec_die_with_parent(signal.SIGKILL))
        print(child.pid, flush=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert alive(child)
        parent.kill()
        parent.wait(timeout=EXIT_BOUND_S)
        assert not wait_gone([child], EXIT_BOUND_S), "the child outlived its killed parent"
    finally:
        kill_all([child])
        parent.stdout.close()


@linux
def test_children_started_through_a_lasting_thread_outlive_the_thread_that_asked():
    """The kernel signals a child when the *thread* that forked it ends: a child started on a short-lived
    thread dies with that thread, one started through `in_lasting_thread` does not."""
    direct = _started_on_a_thread_that_ends(_sleeper)
    lasting = _started_on_a_thread_that_ends(lambda: in_lasting_thread(_sleeper))
    try:
        assert direct.wait(timeout=EXIT_BOUND_S) == -signal.SIGKILL
        time.sleep(0.5)  # a signal sent would have landed by now (a loaded machine could only hide it)
        assert lasting.poll() is None
    finally:
        for p in (direct, lasting):
            p.kill()
            p.wait()


def test_in_lasting_thread_returns_and_raises_in_the_caller():
    got = []

    def name() -> str:
        return threading.current_thread().name

    t = threading.Thread(target=lambda: got.append(in_lasting_thread(name)))
    t.start()
    t.join()
    assert got == ["flashstate-child-starter"]
    on_main = threading.current_thread() is threading.main_thread()  # not so under every test runner
    assert in_lasting_thread(name) == (name() if on_main else "flashstate-child-starter")

    def boom():
        raise ValueError("boom")

    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(ValueError, in_lasting_thread, boom)))
    t.start()
    t.join()
    assert errors and "boom" in str(errors[0].value)


def test_sigterm_unwinds_through_finally_blocks():
    script = textwrap.dedent("""
        import os, signal, time
        from flashstate.lifeline import Terminated, terminate_on_signals
        try:
            with terminate_on_signals():
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(60)
                finally:
                    print("cleaned up", flush=True)
        except Terminated as e:
            print(e, flush=True)
            raise SystemExit(128 + e.signum)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[:2] == ["cleaned up", "stopped by SIGTERM"], done
    assert done.returncode == 128 + signal.SIGTERM
