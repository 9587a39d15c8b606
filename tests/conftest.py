import os
import tempfile

import pytest

# Everything the engine caches on disk (the default model, calibration fits) goes to a per-run folder,
# never the user's home; server subprocesses inherit it.
os.environ.setdefault("FLASHSTATE_HOME", tempfile.mkdtemp(prefix="flashstate-test-"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The embedded default model, materialised once per test session (HF format on disk)."""
    from flashstate.models.presets import materialize

    path = tmp_path_factory.mktemp("tiny")
    materialize("tiny", path, seed=0)
    return str(path)


@pytest.fixture(scope="session")
def mooncake_master(tmp_path_factory):
    """A real mooncake_master on a free loopback port, shared by the session's host-tier tests."""
    from flashstate.cache.host.mooncake import start_master

    master = start_master(log=str(tmp_path_factory.mktemp("mooncake") / "master.log"))
    yield master
    master.stop()
