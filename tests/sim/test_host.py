"""The host tier in the simulator: the real index and layout decide what is held, time comes from the
measured rates; a run with `--host-cache memory` restores what the GPU cache evicted."""

import json
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from flashstate.bench.step_summary import STEP_FIELDS
from flashstate.bench.workloads import load_workload
from flashstate.cache.cost import PrefillCost
from flashstate.cache.host.restore import RestorePhase
from flashstate.sim import host as sim_host
from flashstate.sim.command import _stats
from flashstate.sim.host import SimHostTier
from flashstate.sim.profile import HostCallCosts, ProfileError, load_profile
from flashstate.spec.hf_config import spec_of

from .helpers import growing, run

COSTS = [f.name for f in fields(HostCallCosts)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _tier(
    capacity: int = 64 << 30, inline: bool = False, prefetch: bool = False
) -> tuple[SimHostTier, Clock]:
    clock = Clock()
    spec = spec_of("qwen3-next-2b")
    cost = PrefillCost(1e-5, 1e-10)
    tier = SimHostTier(
        spec, torch.bfloat16, 64, capacity, cost, clock, 256, inline_fetch=inline, prefetch=prefetch
    )
    return tier, clock


def test_a_written_state_is_found_once_its_write_has_landed():
    tier, clock = _tier()
    tokens = list(range(1, 1001))
    tier.write_back(tokens, 1000, blocks=[], slot=0)
    assert tier.lookup(tokens + [5, 6], limit=1001) is None  # still being written
    state = tier.state_bytes + (1000 - 768) * tier.token_bytes  # three whole 256-token chunks before it
    clock.now = (state + 3 * tier.chunk_bytes) / sim_host.WRITE_BYTES_PER_S
    hit = tier.lookup(tokens + [5, 6], limit=1001)
    assert hit is not None and hit.depth == 1000 and len(hit.chunks) == 3
    assert tier.lookup(tokens + [5, 6], limit=1001, floor=1000) is None  # not deeper than the GPU's hit
    assert tier.lookup([9] + tokens[1:], limit=1000) is None  # another path


def test_a_restore_lands_after_its_fetched_bytes_at_the_restore_rate_and_its_objects():
    tier, clock = _tier()
    tokens = list(range(1, 1001))
    tier.write_back(tokens, 1000, blocks=[], slot=0)
    clock.now = 10.0
    hit = tier.lookup(tokens, limit=1000)
    restore = tier.start_restore(hit, first_chunk=2, kv_depth=1000, blocks=[], slot=0)
    fetched = (1000 - 512) * tier.token_bytes + tier.state_bytes  # chunks 0 and 1 shared from the GPU
    objects = 2  # chunk 2 and the state object
    assert restore.ready_at == 10.0 + fetched / sim_host.RESTORE_BYTES_PER_S + objects * 1e-3
    assert restore.fetched_at == restore.ready_at  # the request's trace line says when, as a server's does
    assert not restore.ready() and restore.poll() is RestorePhase.PENDING and restore.depth == 1000
    assert tier.index.states[hit.key].pins == 1  # not evicted while it is read, as in the real tier
    clock.now = restore.ready_at
    assert restore.ready() and restore.poll() is RestorePhase.READY and tier.index.states[hit.key].pins == 0


def test_an_inline_fetch_is_ready_at_admission():
    tier, clock = _tier(inline=True)
    tokens = list(range(1, 1001))
    tier.write_back(tokens, 1000, blocks=[], slot=0)
    clock.now = 10.0
    restore = tier.start_restore(
        tier.lookup(tokens, limit=1000), first_chunk=0, kv_depth=1000, blocks=[], slot=0
    )
    assert restore.ready_at == 10.0 and restore.ready() and restore.poll() is RestorePhase.READY


def test_a_restore_read_ahead_costs_the_engine_its_copy_and_what_is_left_of_the_read():
    # The real tier's read-ahead (cache/host/prefetch.py): from the request's queueing, the profile's rate per
    # token read on a fetch thread beside the busy engine thread. The restore that takes it over charges the
    # engine thread `load` and what is left of the read at the inline rate (the engine waits for it), and
    # runs in the step that admits it. A read-ahead that does not cover the restore is dropped, its pin with
    # it, and the restore reads inline.
    tier, clock = _tier(inline=True, prefetch=True)
    tokens = list(range(1, 1001))
    tier.write_back(tokens, 1000, blocks=[], slot=0)
    clock.now = 10.0
    hit = tier.lookup(tokens, limit=1000)
    calls, _ = tier.calls, tier.take_engine_seconds()
    inline = 1000 * (calls.restore_s_per_token - calls.load_s_per_token)
    read = 1000 * calls.read_ahead_s_per_token
    for left in (-0.5, 0.0, 0.5, 1.0):  # admitted after the read landed, as it lands, half-way, at its start
        prefetch = tier.prefetch(hit, first_chunk=0)
        assert prefetch.ready_at == pytest.approx(clock.now + read) and tier.index.states[hit.key].pins == 1
        clock.now = prefetch.ready_at - left * read
        restore = tier.start_restore(hit, 0, 1000, blocks=[], slot=0, prefetched=prefetch)
        assert restore.inline and restore.ready_at == clock.now
        assert restore.fetched_at == min(prefetch.ready_at, clock.now)
        waited = max(left, 0.0) * inline
        assert tier.take_engine_seconds() == pytest.approx(1000 * calls.load_s_per_token + waited)
        assert restore.poll() is RestorePhase.READY and tier.index.states[hit.key].pins == 0
    other = tier.prefetch(hit, first_chunk=1)  # read from chunk 1: a restore from chunk 0 needs more
    tier.start_restore(hit, 0, 1000, blocks=[], slot=0, prefetched=other)
    assert tier.take_engine_seconds() == pytest.approx(
        1000 * calls.restore_s_per_token
    )  # read inline after all
    assert tier.index.states[hit.key].pins == 1 and tier.prefetches_held == 0
    assert (tier.prefetches, tier.prefetches_used) == (5, 4)


def test_the_host_tier_serves_what_the_gpu_cache_evicted():
    # A GPU cache far below the agents' working set: without the host tier the later turns recompute;
    # with it they restore the evicted states and hit deeper, and every request still completes.
    sessions = [growing(f"s{i}", turns=6, first=3001 + 100 * i, step=2003, think=4.0) for i in range(6)]
    flags = ["--kv-cache-memory-bytes", "700M", "--max-num-seqs", "6"]
    gpu, _ = run(sessions, "flashstate", flags, agents=6)
    tiered, engines = run(
        sessions, "flashstate", [*flags, "--host-cache", "memory", "--host-prefetch"], agents=6
    )
    tier = engines[0].host
    landed = engines[0].cache.stats.host_hits
    assert tier is not None and 0 < landed <= tier.restores_started
    assert all(r.error is None and r.output_tokens == 50 for r in tiered.requests)
    assert len(tiered.requests) == len(gpu.requests) == 36
    assert sum(r.cached_tokens for r in tiered.requests) > sum(r.cached_tokens for r in gpu.requests)
    # the request lines mark each landed restore with its fetch, as a server's step trace does
    fetched = [row for row in engines[0].request_rows if row["fetched"] is not None]
    assert len(fetched) == landed and all(
        row["arrival"] <= row["fetched"] <= row["running"] for row in fetched
    )
    assert 0 < tier.prefetches_used <= tier.prefetches  # queued requests' hits were read ahead
    stats = _stats(engines[0])  # what `simulate` reports of the run
    assert [stats["host_prefetches"], stats["host_prefetches_used"]] == [
        tier.prefetches,
        tier.prefetches_used,
    ]
    engines[0].scheduler.check_integrity()
    assert not engines[0].has_work


def test_the_engine_threads_time_in_the_tiers_calls_is_taken_once():
    tier, clock = _tier()
    tokens = list(range(1, 1001))
    tier.write_back(tokens, 1000, blocks=[], slot=0)
    calls = tier.calls  # the profile's; by default the 2B preset's measured costs
    assert tier.take_engine_seconds() == calls.write_back_s and tier.take_engine_seconds() == 0
    clock.now = 10.0
    hit = tier.lookup(tokens, limit=1000)
    tier.start_restore(hit, first_chunk=0, kv_depth=1000, blocks=[], slot=0)
    taken = tier.take_engine_seconds()
    assert taken == 1000 * (calls.lookup_s_per_token + calls.restore_s_per_token)
    assert tier.engine_seconds == calls.write_back_s + taken


def test_the_steps_wait_out_the_tiers_calls_unless_the_profile_holds_them(tmp_path):
    # The same replay with the calls charged (the graphed profile, fitted without a tier) and with a copy of
    # that profile marked as fitted on a host-tier run: only the first run's steps carry the calls' time.
    sessions = [growing(f"s{i}", turns=6, first=3001 + 100 * i, step=2003, think=4.0) for i in range(6)]
    flags = ["--kv-cache-memory-bytes", "700M", "--max-num-seqs", "6", "--host-cache", "memory"]
    graphed = load_profile("h200-qwen3-next-2b-graphed")
    doc = json.loads(Path(graphed.path).read_text()) | {"host": {"calls_in_steps": True}}
    held = tmp_path / "held.json"
    held.write_text(json.dumps(doc))
    charged, (engine,) = run(sessions, "flashstate", flags, agents=6, profile="h200-qwen3-next-2b-graphed")
    free, (engine_free,) = run(sessions, "flashstate", flags, agents=6, profile=str(held))
    assert engine.host.engine_seconds > 0 and engine_free.host.engine_seconds > 0
    assert engine.busy_seconds > engine_free.busy_seconds
    assert len(charged.requests) == len(free.requests) == 36
    # the step trace says which steps waited them out (`host_ms`, as the engine's trace does)
    traced = [sum(dict(zip(STEP_FIELDS, r, strict=True))["host_ms"] for r in e.step_rows) / 1e3
              for e in (engine, engine_free)]  # fmt: skip
    left = engine.host.take_engine_seconds()  # the write-backs after the last step
    assert traced[0] + left == pytest.approx(engine.host.engine_seconds, abs=1e-6 * len(engine.step_rows))
    assert traced[1] == 0


def test_the_profile_says_what_the_tiers_calls_cost(tmp_path):
    # A profile's host section prices the calls (a real-size model's restores cost more per token than the
    # 2B preset's defaults); zero costs charge nothing, and an unknown field is named.
    sessions = [growing(f"s{i}", turns=6, first=3001 + 100 * i, step=2003, think=4.0) for i in range(6)]
    flags = ["--kv-cache-memory-bytes", "700M", "--max-num-seqs", "6", "--host-cache", "memory"]
    graphed = json.loads(Path(load_profile("h200-qwen3-next-2b-graphed").path).read_text())
    runs = {}
    for name, host in (("double", {"restore_s_per_token": 2.6e-6}), ("free", dict.fromkeys(COSTS, 0.0))):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(graphed | {"host": host}))
        assert load_profile(str(path)).host_calls.restore_s_per_token == host["restore_s_per_token"]
        runs[name] = run(sessions, "flashstate", flags, agents=6, profile=str(path))[1][0]
    assert runs["double"].host.calls.restore_s_per_token == 2.6e-6 and runs["double"].host.engine_seconds > 0
    assert runs["free"].host.engine_seconds == 0 and runs["free"].host.restores_started > 0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(graphed | {"host": {"restore_s": 1e-6}}))
    with pytest.raises(ProfileError, match="restore_s"):
        load_profile(str(path))


def test_a_restore_keeps_the_kv_path_its_working_slot_could_have_evicted(traces):
    """A request's working slot, charged to the shared budget, evicts units at its admission; its own hit is
    locked, but the KV-only path below it that a host restore shares was not, and evicting it left the
    restore walking a path no longer in the tree (found replaying the real traces at a quarter of their
    working set). Real traces where that happened: every request answered, the pools whole."""
    sessions = load_workload(str(traces), "auto", None, None, None)
    flags = ["--kv-cache-memory-bytes", "800M", "--max-num-seqs", "16", "--host-cache", "memory"]
    replay = {
        "agents": 16, "warmup_s": 5.0, "duration_s": 60.0, "ramp_s": 2.0, "length_scale": 0.1,
        "time_scale": 0.05, "max_think_s": 2.0, "max_output_tokens": 64, "max_sessions": None,
    }  # fmt: skip
    result, (engine,) = run(sessions, "flashstate", flags, **replay)
    assert engine.plan.working_charged and engine.cache.stats.host_hits > 100
    assert result.requests and all(r.error is None for r in result.requests)
    engine.scheduler.check_integrity()
