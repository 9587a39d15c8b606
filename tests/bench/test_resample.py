"""flashstate/bench/resample.py: a recorded run's agents drawn again with replacement, each with all its
turns and sub-agents, read over the run's own window."""

from pathlib import Path

from flashstate.bench.metrics import RequestRecord, SessionRecord, agent_of
from flashstate.bench.report import read_result
from flashstate.bench.resample import session_bands, session_draws
from flashstate.sim.recorded import METRICS

ROOT = Path(__file__).resolve().parents[2]


def _request(session: str, t_send: float, ttft: float) -> dict:
    return RequestRecord(
        lane=0, session=session, depth=session.count("/"), turn=0, t_send=t_send, ttft=ttft, e2e=ttft + 1,
        prompt_tokens=100, cached_tokens=50, output_tokens=10, sent_tokens=100, target_tokens=100,
        max_tokens=10, echoed=False,
    ).as_dict()  # fmt: skip


def _result(requests: list[dict]) -> dict:
    agents = sorted({agent_of(r["session"]) for r in requests})
    sessions = [SessionRecord(lane=0, session=a, turns=1, t_start=0.0).as_dict() for a in agents]
    return {"timeline": {"window": [10.0, 100.0]}, "replay": {}, "requests": requests, "sessions": sessions}


def test_an_agent_is_drawn_with_its_turns_and_sub_agents_inside_the_window():
    result = _result([
        _request("a#0", 20.0, 1.0), _request("a#0", 30.0, 1.0), _request("a#0/x", 40.0, 1.0),
        _request("b#0", 20.0, 3.0),
        _request("b#0", 5.0, 9.0),  # sent in the warm-up: never measured
    ])  # fmt: skip
    draws = session_draws(result, draws=300, seed=1)
    # two agents drawn from {a (3 requests), b (1 in the window)}: aa, ab or bb
    assert {d["requests"] for d in draws} == {6, 4, 2}
    assert {d["ttft_s"]["p90"] for d in draws if d["requests"] == 2} == {3.0}
    band = session_bands(result, {"TTFT p50": METRICS["TTFT p50"]}, draws=300, seed=1)["TTFT p50"]
    assert band[0] == 1.0 and band[1] == 3.0


def test_the_same_seed_draws_the_same_band_on_a_recorded_card_run():
    result = read_result(ROOT / "benchmarks/results/card-2026-12-04/validate-0.5-vllm/result-vllm.json.gz")
    bands = session_bands(result, METRICS, draws=200, seed=3)
    assert bands == session_bands(result, METRICS, draws=200, seed=3)
    for name, (lo, hi) in bands.items():
        assert lo <= hi, name
    lo, hi = bands["TTFT p90"]
    assert lo < hi  # the run's tail is set by some of its agents, not by all alike
