"""`flashstate serve` with faults injected by prompt, so a test can make the engine fail on cue:
`python -m tests.server.fault_server serve ...`.

A prompt whose first token id is
    POISON  makes every model step it is part of raise (a request's own failure),
    FATAL   makes the scheduler raise while it waits (not a request's failure: the engine cannot go on),
    HOLD    holds its first model step until the file named by FAULT_SERVER_RELEASE exists (a stalled loop).
"""

import os
import sys
import time
from pathlib import Path

from flashstate import cli
from flashstate.engine.scheduler import Scheduler
from flashstate.engine.worker.model_runner import ModelRunner

POISON, FATAL, HOLD = 1999, 1998, 1997
RELEASE_ENV = "FAULT_SERVER_RELEASE"

_run, _schedule = ModelRunner.run, Scheduler.schedule


def _run_with_faults(self, batch, *args, **kwargs):
    firsts = {s.token_ids[0] for s in batch.seqs}
    if POISON in firsts:
        raise RuntimeError("injected fault")
    if HOLD in firsts:
        release = Path(os.environ[RELEASE_ENV])
        while not release.exists():
            time.sleep(0.05)
    return _run(self, batch, *args, **kwargs)


def _schedule_with_faults(self):
    if any(s.token_ids[0] == FATAL for s in self.waiting):
        raise RuntimeError("injected scheduler fault")
    return _schedule(self)


if __name__ == "__main__":
    ModelRunner.run = _run_with_faults
    Scheduler.schedule = _schedule_with_faults
    sys.exit(cli.main())
