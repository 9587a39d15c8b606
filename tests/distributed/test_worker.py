import os
import subprocess
import sys

SCRIPT = """
import time
from flashstate.distributed.worker import dump_stacks_when_stuck
def stuck_in_a_collective():
    time.sleep(1.5)
dump_stacks_when_stuck()
stuck_in_a_collective()
"""


def _run(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "FLASHSTATE_STACK_DUMP_S"}
    if env_value is not None:
        env["FLASHSTATE_STACK_DUMP_S"] = env_value
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_stuck_rank_writes_its_stack_at_the_interval_asked():
    err = _run("0.4")
    assert "stuck_in_a_collective" in err
    assert err.count("stuck_in_a_collective") >= 2  # repeated, not once


def test_no_stacks_unless_asked():
    assert _run(None) == ""
    assert _run("0") == ""
