"""What the fleet tests share: the replicas' serve flags, the served model's name, one torch thread per
server process, /metrics reads (a server's, the Mooncake master's), a wait on a condition, and the skip
when vllm-router is not installed."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from flashstate.bench.metrics import parse_prometheus
from flashstate.cache.host.mooncake import MasterProcess
from flashstate.fleet.router import router_executable

MODEL = "flashstate-tiny"
# fixed prefill-cost coefficients: no calibration at start-up (seconds per replica on a busy machine)
SERVE = (
    "--device", "cpu", "--max-num-seqs", "4", "--max-model-len", "8192", "--host-chunk-tokens", "32",
    "--prefill-cost-coefficients", "1e-5", "1e-10",
)  # fmt: skip


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread_per_server():
    """Every server these tests start (they inherit the environment) runs torch on one thread: two
    replicas and a router, or a single engine, on a 2-core machine would otherwise have OpenMP's threads
    wait on each other's descheduled ones (seconds per request instead of a fraction of one)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield


def skip_without_router() -> None:
    """Skip the calling test module (call it at module level) when vllm-router is not installed."""
    try:
        router_executable()
    except FileNotFoundError as e:
        pytest.skip(str(e), allow_module_level=True)


def metrics(url: str) -> dict[str, float]:
    return parse_prometheus(httpx.get(f"{url}/metrics", timeout=30).text)


def metric(url: str, name: str) -> float:
    """A server's sample `name`, summed over its labels."""
    return sum(v for k, v in metrics(url).items() if k.split("{")[0] == name)


def master_metric(master: MasterProcess, name: str) -> float:
    """A sample of a mooncake_master's own /metrics (on its --metrics_port), e.g. master_active_clients."""
    port = next(a.split("=", 1)[1] for a in master.process.args if a.startswith("--metrics_port="))
    return metric(f"http://{master.address.rpartition(':')[0]}:{port}", name)


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll `predicate` until it holds; AssertionError when it never did within `timeout` (a hang guard,
    not a measured time)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.1)
