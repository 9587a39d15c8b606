"""benchmarks/sim_error.py on a recorded card run: each result replayed with its own flags at each step-cost
scale, the error read at the profile's own costs, the spread over the scales, the card's band over its
agents."""

import json

from flashstate.bench.report import read_result

from .scripts import ROOT, run_script

RUN = ROOT / "benchmarks/results/card-2026-12-04/validate-0.5-vllm"


def _script(*args: str):
    return run_script("sim_error.py", *args)


def test_the_error_and_its_spread_over_step_costs(traces, tmp_path):
    done = _script(str(RUN), "--profile", "h200-qwen3-next-2b-tune", "--traces", str(traces), "--scales", "1",
                   "1.03", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "errors.json").read_text())
    rows = {r["metric"]: r for r in doc["rows"]}
    assert set(rows) == {"hit rate", "uncached p50", "TTFT p50", "TTFT p90", "output TPM"}
    for name, r in rows.items():
        assert r["label"] == "vllm" and r["spread"][0] <= r["simulated"] <= r["spread"][1]
        limit = 0.05 if name == "hit rate" else 0.15  # this run's error on the tune profile (RESULTS.md)
        assert abs(r["error"]) <= limit, r
        lo, hi = r["card_band"]  # the card's figure over its agents drawn again
        assert lo <= hi and r["simulated_inside_band"] == (lo <= r["simulated"] <= hi)
    assert rows["output TPM"]["spread"][0] < rows["output TPM"]["spread"][1]  # slower steps, fewer tokens
    assert "| validate-0.5-vllm | vllm | TTFT p90 |" in (tmp_path / "errors.md").read_text()


def test_the_scales_must_hold_the_profile_itself(tmp_path):
    done = _script(str(RUN), "--profile", "x", "--traces", "x", "--scales", "0.9", "--out", str(tmp_path))
    assert done.returncode == 2 and "--scales must include 1" in done.stderr


def test_the_card_send_times_hold_every_turn_back_to_when_the_card_sent_it(traces, tmp_path):
    done = _script(str(RUN), "--profile", "h200-qwen3-next-2b-tune", "--traces", str(traces), "--noise-seeds",
                   "1", "--card-send-times", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "errors.json").read_text())["card_send_times"] is True
    card = read_result(next(RUN.glob("result-vllm.json*")))
    sim = read_result(tmp_path / RUN.name / "x1-seed0" / "result-vllm.json")
    sent = {(r["session"], r["turn"]): r["t_send"] for r in card["requests"]}
    matched = [
        (r["t_send"], sent[r["session"], r["turn"]])
        for r in sim["requests"]
        if (r["session"], r["turn"]) in sent
    ]
    assert len(matched) > 0.9 * len(sim["requests"])
    assert all(t >= card_t - 1e-6 for t, card_t in matched)
    assert "each turn sent when the card sent it" in (tmp_path / "errors.md").read_text()
