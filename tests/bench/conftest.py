import pytest

from flashstate.bench.workloads import load_agentx


@pytest.fixture(scope="session")
def real_sessions(traces):
    return load_agentx(traces)
