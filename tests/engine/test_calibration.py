"""The prefill-cost calibration, with injected timings (never a threshold on a real measurement): a sound
measurement is fitted and cached with its hardware, a noisy one is retried then replaced by the default,
and a cached fit from other hardware (or a clamped one) is measured again."""

import json
import logging

import pytest

from flashstate import LLM
from flashstate.cache.cost import DEFAULT_COST, PrefillCost
from flashstate.cli import main
from flashstate.engine import calibration
from flashstate.engine.calibration import calibrate, calibration_lengths, judge

A, B = 5e-5, 2e-8  # a quiet CPU's tiny model, roughly


def quiet(n: int) -> list[float]:
    t = A * n + B * n * n
    return [t, 1.02 * t, 0.99 * t]


def _scripted(*attempts):
    """A `measure` that gives attempt k's times for its lengths, in order (lengths 128..1024)."""
    lengths = calibration_lengths(1024)
    calls = []

    def measure(n: int) -> list[float]:
        k = len(calls) // len(lengths)
        calls.append(n)
        times = attempts[min(k, len(attempts) - 1)]
        return times(n) if callable(times) else times[lengths.index(n)]

    return measure, calls


def _calibrate(measure, **kw):
    return calibrate(None, None, 16, 256, 1024, None, measure=measure, **kw)


@pytest.fixture
def timings(monkeypatch):
    """The engine's measurements, injected: set `.measure` to a length → repeated seconds."""

    class Timings:
        measure = staticmethod(quiet)
        calls = 0

    def fake(model, caches, n, block_size, chunk, device, repeats=calibration.REPEATS):
        Timings.calls += 1
        return Timings.measure(n)

    monkeypatch.setattr(calibration, "time_prefill_runs", fake)
    return Timings


def test_fit_recovers_known_coefficients():
    lengths = [128, 512, 2048, 8192, 32768]
    cost = PrefillCost.fit(lengths, [3e-6 * n + 2e-11 * n * n for n in lengths])
    assert cost.a == pytest.approx(3e-6, rel=1e-6) and cost.b == pytest.approx(2e-11, rel=1e-6)
    assert cost.saved(1000, 400) == pytest.approx(cost(1000) - cost(400))
    linear = PrefillCost.fit([100, 200, 400], [1.0, 1.9, 3.7])  # attention invisible: b clamps to 0
    assert linear.b == 0 and linear.a > 0
    with pytest.raises(ValueError, match="two"):
        PrefillCost.fit([100], [1.0])


def test_a_sound_measurement_is_fitted_at_the_first_attempt():
    measure, calls = _scripted(quiet)
    cost, detail = _calibrate(measure)
    assert cost.kind == "measured" and detail["rejections"] == [] and "rejected" not in detail
    assert cost.a == pytest.approx(A, rel=0.02) and cost.b == pytest.approx(B, rel=0.02)
    assert calls == calibration_lengths(1024) and detail["r2"] > 0.999
    assert detail["runs"][0] == quiet(128) and detail["seconds"][0] == pytest.approx(A * 128 + B * 128**2)


@pytest.mark.parametrize(
    ("seconds", "why"),
    [
        ([[0.009] * 3, [0.0135, 0.05, 0.014], [0.031] * 3, [0.075] * 3], "repeats of 256 tokens spread"),
        ([[0.168] * 3, [0.048] * 3, [0.63] * 3, [0.34] * 3], "256 tokens took no longer than 128"),
        ([[0.5] * 3, [0.9] * 3, [1.4] * 3, [2.6] * 3], "clamped to 0"),  # b = 0: C(n) = 0.0026·n
        ([[0.05] * 3, [0.3] * 3, [0.35] * 3, [1.0] * 3], "R² = 0.962"),
    ],
    ids=["spread", "non-monotone", "clamped", "poor-fit"],
)
def test_judge_names_what_looks_like_a_busy_machine(seconds, why):
    lengths = calibration_lengths(1024)
    cost = PrefillCost.fit(lengths, [s[1] for s in seconds])
    assert why in judge(lengths, seconds, cost)
    assert judge(lengths, [quiet(n) for n in lengths], PrefillCost(A, B)) is None


def test_a_rejected_measurement_is_retried():
    busy = [[0.168] * 3, [0.048] * 3, [0.63] * 3, [0.34] * 3]
    measure, calls = _scripted(busy, quiet)
    cost, detail = _calibrate(measure)
    assert cost.kind == "measured" and cost.b > 0 and len(calls) == 8
    assert len(detail["rejections"]) == 1 and "took no longer" in detail["rejections"][0]


def test_a_machine_too_busy_to_measure_gets_the_default_cost_and_the_reason_in_the_log(caplog):
    linear = [[0.0026 * n] * 3 for n in calibration_lengths(1024)]  # the busy machine's C(n) = 0.0026·n
    measure, calls = _scripted(linear)
    with caplog.at_level(logging.INFO, logger="flashstate"):
        cost, detail = _calibrate(measure, attempts=3)
    assert cost is DEFAULT_COST and cost.kind == "default"
    assert len(calls) == 3 * 4 and len(detail["rejections"]) == 3 and "clamped to 0" in detail["rejected"]
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and "rejected 3 times" in warning[0].message
    assert "clamped to 0" in warning[0].message and "using the default" in warning[0].message


def test_engine_calibrates_once_then_reads_the_cached_fit(tiny_model_dir, tmp_path, timings):
    first = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), max_num_batched_tokens=256)
    assert first.engine.cost.source == "measured" and first.engine.cost.b > 0
    (stored,) = tmp_path.glob("*.json")
    record = json.loads(stored.read_text())
    assert record["hardware"] == calibration.hardware(first.engine.device)
    assert {"device", "torch", "cpu_count", "torch_threads"} <= set(record["hardware"])
    measured = timings.calls
    second = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), max_num_batched_tokens=256)
    assert second.engine.cost.source == "cached" and timings.calls == measured
    assert (second.engine.cost.a, second.engine.cost.b) == (first.engine.cost.a, first.engine.cost.b)
    given = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), prefill_cost_coefficients=(1.0, 2.0))
    assert (given.engine.cost.a, given.engine.cost.b, given.engine.cost.source) == (1.0, 2.0, "given")
    assert given.engine.cache.policy.cost is given.engine.cost


@pytest.mark.parametrize("stale", ["other hardware", "no hardware, clamped"])
def test_a_cached_fit_from_other_hardware_or_clamped_is_measured_again(
    tiny_model_dir, tmp_path, timings, stale
):
    LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), max_num_batched_tokens=256)
    (stored,) = tmp_path.glob("*.json")
    record = json.loads(stored.read_text())
    if stale == "other hardware":
        record["hardware"]["torch"] = "0.0.1"
        record["a"] = 1.0
    else:  # a record cached before fits were judged: the busy machine's fit, no hardware
        record = {"a": 0.0026, "b": 0.0, "device": record["device"], "date": "2026-11-01"}
    stored.write_text(json.dumps(record))
    measured = timings.calls
    llm = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), max_num_batched_tokens=256)
    assert llm.engine.cost.source == "measured" and timings.calls > measured
    assert llm.engine.cost.a == pytest.approx(A, rel=0.02) and llm.engine.cost.b == pytest.approx(B, rel=0.02)
    assert json.loads(stored.read_text())["hardware"] == calibration.hardware(llm.engine.device)


def test_a_noisy_engine_start_falls_back_to_the_default_and_caches_nothing(tiny_model_dir, tmp_path, timings):
    timings.measure = staticmethod(lambda n: [0.0026 * n, 0.0026 * n * 3, 0.0026 * n])
    llm = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), max_num_batched_tokens=256)
    assert llm.engine.cost is DEFAULT_COST and llm.engine.cost.kind == "default"
    assert timings.calls == calibration.MAX_ATTEMPTS * len(calibration_lengths(1024))
    assert not list(tmp_path.glob("*.json"))
    again = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), max_num_batched_tokens=256)
    assert again.engine.cost is DEFAULT_COST  # not measured again in this process: it starts fast
    assert timings.calls == calibration.MAX_ATTEMPTS * len(calibration_lengths(1024))


def test_calibrate_command_prints_and_stores_the_fit(tiny_model_dir, tmp_path, capsys, timings):
    rc = main(["calibrate", "--model", tiny_model_dir, "--max-tokens", "512", "--calibration-cache-dir",
               str(tmp_path), "--max-num-batched-tokens", "256"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "C(n) = " in out and "| 512 |" in out
    stored = list(tmp_path.glob("*.json"))
    assert len(stored) == 1
    # The server/engine with the same settings now starts from that fit.
    llm = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), max_num_batched_tokens=256)
    assert llm.engine.cost.source == "cached"


def test_the_source_is_a_kind_never_a_path():
    assert PrefillCost(1, 2, "cached").kind == "cached"
    assert PrefillCost(1, 2, "cached:/home/me/.cache/flashstate/calibration/x.json").kind == "cached"
    assert PrefillCost(1, 2, "profile:/data/h200.json (fitted)").kind == "given"
    assert DEFAULT_COST.kind == "default" and PrefillCost.fit([1, 2], [1.0, 4.0]).kind == "measured"


def test_calibration_lengths_reach_the_longest_prefill():
    """The long end shows the attention term: the lengths end at the cap (32k on a GPU), not at 8k."""
    assert calibration_lengths(32768) == [512, 1024, 2048, 4096, 8192, 16384, 32768]
    assert calibration_lengths(1024) == [128, 256, 512, 1024]
    assert calibration_lengths(40000)[-2:] == [32768, 40000] and len(calibration_lengths(40000)) == 7
    assert calibration_lengths(100) == [50, 100]


def test_on_a_fast_gpu_the_launch_bound_short_lengths_are_left_out_of_the_fit():
    """The H200's 2B preset: every prefill up to ~8k tokens takes the eager forward's ~40 ms of host work,
    which rejected all three attempts ("1024 tokens took no longer than 512") on every start."""
    a, b = 3.6e-6, 1.05e-10
    lengths = calibration_lengths(32768)

    def gpu(n: int) -> list[float]:
        t = max(0.04, a * n + b * n * n)
        return [t, 1.01 * t, 0.995 * t]

    cost, detail = calibrate(None, None, 16, 8192, 32768, None, measure=gpu)
    assert cost.kind == "measured" and detail["rejections"] == []
    assert detail["launch_bound"] == [512, 1024, 2048, 4096] and detail["lengths"] == [8192, 16384, 32768]
    assert cost.a == pytest.approx(a, rel=0.1) and cost.b == pytest.approx(b, rel=0.1)
    flat = [[0.04] * 3 for _ in lengths]  # nothing above the floor: still rejected, never fitted to noise
    _, detail = calibrate(None, None, 16, 8192, 32768, None, measure=lambda n: flat[lengths.index(n)])
    assert "took no longer" in detail["rejected"]
    assert calibration.compute_bound_from([0.168, 0.048, 0.63, 0.34]) == 0  # a busy machine is not flat
