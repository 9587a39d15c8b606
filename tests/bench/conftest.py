import os
from pathlib import Path

import pytest

from flashstate.bench.workloads import load_agentx

REPO = Path(__file__).resolve().parents[2]


def traces_dir() -> Path:
    """FLASHSTATE_TRACES, default ../shared/traces/claude-code next to the repository."""
    return Path(os.environ.get("FLASHSTATE_TRACES", REPO.parent / "shared" / "traces" / "claude-code"))


@pytest.fixture(scope="session")
def traces() -> Path:
    path = traces_dir()
    if not path.is_dir():
        pytest.skip(f"real traces not found at {path} (set FLASHSTATE_TRACES)")
    return path


@pytest.fixture(scope="session")
def real_sessions(traces):
    return load_agentx(traces)
