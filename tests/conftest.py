import gc
import os
import tempfile
from pathlib import Path

import pytest

# Everything the engine caches on disk (the default model, calibration fits) goes to a per-run folder,
# never the user's home; server subprocesses inherit it.
os.environ.setdefault("FLASHSTATE_HOME", tempfile.mkdtemp(prefix="flashstate-test-"))
# litellm (under mini-swe-agent and the litellm tests) reads its model cost map from the package, not the
# network, which CI does not reach
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def traces() -> Path:
    """The real Claude-Code traces: FLASHSTATE_TRACES, default ../shared/traces/claude-code next to the
    repository; tests that need them skip where they are not."""
    path = Path(os.environ.get("FLASHSTATE_TRACES", REPO.parent / "shared" / "traces" / "claude-code"))
    if not path.is_dir():
        pytest.skip(f"real traces not found at {path} (set FLASHSTATE_TRACES)")
    return path


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


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux
        return 0


@pytest.fixture(autouse=True)
def _free_dropped_engines():
    """An engine a test drops sits in reference cycles (with its cache tensors, GiBs on the CPU) until a full
    collection, which may come many tests later: the suite held 20 GiB at times. Collect once the process
    holds more than 4 GiB, so a 24 GiB CI machine never runs out."""
    yield
    if _resident_bytes() > 4 << 30:
        gc.collect()
