"""A fleet of real processes on loopback: vllm-router before two `flashstate serve` replicas (embedded tiny
model, CPU) whose host tiers share one real mooncake_master. A replica restores a session another replica
served, at a depth far below the prompt's end, with the same greedy tokens as a fresh prefill; a bench
replay through the router loses no session when a replica is SIGKILLed mid-run, and the replica rejoins."""

import asyncio
import random
import signal
import threading

import httpx
import pytest

from flashstate.bench import synthetic
from flashstate.bench.config import ReplayConfig
from flashstate.bench.replay import fetch_metrics, replay
from flashstate.bench.synthetic_defaults import DEFAULT as SYNTHETIC
from flashstate.fleet.launch import FleetSpec, running_fleet
from tests.fleet.conftest import MODEL, SERVE, master_metric, metric, skip_without_router, wait_until

skip_without_router()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    spec = FleetSpec(replicas=2, policy="cache_aware", shared=True, host_cache_bytes="64M", serve_args=SERVE)
    with running_fleet(spec, tmp_path_factory.mktemp("fleet")) as f:
        yield f


def _complete(url: str, prompt: list[int], **extra) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, **extra}  # fmt: skip
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_replica_restores_a_session_another_replica_served(fleet):
    first, second = (r.url for r in fleet.replicas)
    rng = random.Random(0)
    prompt = [rng.randrange(2000) for _ in range(300)]
    out = _complete(first, prompt)["choices"][0]["token_ids"]
    wait_until(lambda: metric(first, "flashstate:host_cache_states_written_total") >= 1)
    # the next turn appends 7 chunks of 32: the state lies far below the prompt's end
    turn = prompt + out + [rng.randrange(2000) for _ in range(230)]
    got = _complete(second, turn)
    depth = len(prompt) + len(out) - 1  # the last sampled token never ran through the model
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == depth
    assert metric(second, "flashstate:host_cache_remote_restores_total") == 1
    assert metric(second, "flashstate:host_cache_remote_restored_tokens_total") == depth
    fresh = _complete(first, turn, cache_salt="reference")  # another salt: no state of it anywhere
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert got["choices"][0]["token_ids"] == fresh["choices"][0]["token_ids"]


def test_a_replica_killed_mid_replay_loses_no_session_and_rejoins(fleet):
    config = ReplayConfig(
        base_url=fleet.url, agents=8, duration_s=600, max_requests=120, length_scale=0.01, time_scale=0.0,
        max_output_tokens=4, retries=6, progress=False, seed=3,
    )  # fmt: skip
    victim = fleet.replicas[1]
    served_before = metric(victim.url, "vllm:request_success_total")
    killed = threading.Event()

    def kill_when_busy() -> None:
        wait_until(lambda: metric(victim.url, "vllm:request_success_total") >= served_before + 3, 300)
        victim.kill(signal.SIGKILL)
        killed.set()

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    result = replay(config, synthetic.session_stream(SYNTHETIC, 3))
    killer.join(5)
    assert killed.is_set()
    assert not any(s.failed for s in result.sessions), [s for s in result.sessions if s.failed]
    assert sum(s.complete for s in result.sessions) >= 1
    assert all(r.error is None or "HTTP 4" not in r.error for r in result.requests)

    assert fleet.restart_dead() == [1]  # started again on its port: the router's health poll lets it back in
    wait_until(lambda: httpx.get(f"{fleet.url}/readiness", timeout=10).json().get("healthy_workers") == 2)
    before = metric(victim.url, "vllm:request_success_total")
    _complete(victim.url, [1, 2, 3])
    assert metric(victim.url, "vllm:request_success_total") == before + 1
    # bench's /metrics behind the router: both replicas' counters, summed
    merged = asyncio.run(_fetch(fleet.url))
    parts = [metric(r.url, "vllm:prompt_tokens_total") for r in fleet.replicas]
    assert sum(v for k, v in merged.items() if k.split("{")[0] == "vllm:prompt_tokens_total") >= sum(parts)


async def _fetch(url: str) -> dict[str, float]:
    async with httpx.AsyncClient() as http:
        return await fetch_metrics(http, url)


def test_the_master_killed_and_started_again_stops_no_request_and_sharing_resumes(fleet, tmp_path):
    first, second = (r.url for r in fleet.replicas)
    fleet.master.process.kill()
    fleet.master.process.wait()
    rng = random.Random(1)
    prompt = [rng.randrange(2000) for _ in range(200)]
    assert _complete(fleet.url, prompt)["choices"][0]["token_ids"]  # served without the tier
    wait_until(lambda: any(metric(r.url, "flashstate:host_cache_available") == 0 for r in fleet.replicas))

    fleet.restart_master(tmp_path / "master-again.log")
    for url in (first, second):
        wait_until(lambda url=url: metric(url, "flashstate:host_cache_available") == 1)
    # the new master takes a replica's puts once that replica has mounted its segment there again (its ping
    # counts the refusal before as the master being up): both segments, 64 MiB each
    wait_until(lambda: master_metric(fleet.master, "master_total_capacity_bytes") >= 2 * (64 << 20))
    # sharing works again on the new (empty) master
    written = metric(first, "flashstate:host_cache_states_written_total")
    restored = metric(second, "flashstate:host_cache_remote_restores_total")
    out = _complete(first, prompt + [7] * 10)["choices"][0]["token_ids"]
    wait_until(lambda: metric(first, "flashstate:host_cache_states_written_total") > written)
    got = _complete(second, prompt + [7] * 10 + out + [rng.randrange(2000) for _ in range(40)])
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt) + 10 + len(out) - 1
    assert metric(second, "flashstate:host_cache_remote_restores_total") == restored + 1
