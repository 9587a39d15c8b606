import pytest

from flashstate import LLM
from flashstate.cache.cost import PrefillCost
from flashstate.cli import main
from flashstate.engine.calibration import calibration_lengths


def test_fit_recovers_known_coefficients():
    lengths = [128, 512, 2048, 8192, 32768]
    cost = PrefillCost.fit(lengths, [3e-6 * n + 2e-11 * n * n for n in lengths])
    assert cost.a == pytest.approx(3e-6, rel=1e-6) and cost.b == pytest.approx(2e-11, rel=1e-6)
    assert cost.saved(1000, 400) == pytest.approx(cost(1000) - cost(400))
    linear = PrefillCost.fit([100, 200, 400], [1.0, 1.9, 3.7])  # attention invisible: b clamps to 0
    assert linear.b == 0 and linear.a > 0
    with pytest.raises(ValueError, match="two"):
        PrefillCost.fit([100], [1.0])


def test_engine_calibrates_once_then_reads_the_cached_fit(tiny_model_dir, tmp_path):
    first = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), max_num_batched_tokens=256)
    assert first.engine.cost.source == "calibrated" and first.engine.cost(1000) > 0
    assert len(list(tmp_path.glob("*.json"))) == 1
    second = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), max_num_batched_tokens=256)
    assert second.engine.cost.source.startswith("cached:")
    assert (second.engine.cost.a, second.engine.cost.b) == (first.engine.cost.a, first.engine.cost.b)
    given = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), prefill_cost_coefficients=(1.0, 2.0))
    assert (given.engine.cost.a, given.engine.cost.b, given.engine.cost.source) == (1.0, 2.0, "given")
    assert given.engine.cache.policy.cost is given.engine.cost


def test_calibrate_command_prints_and_stores_the_fit(tiny_model_dir, tmp_path, capsys):
    rc = main(["calibrate", "--model", tiny_model_dir, "--max-tokens", "512", "--calibration-cache-dir",
               str(tmp_path), "--max-num-batched-tokens", "256"])
    out = capsys.readouterr().out
    assert rc == 0 and "C(n) = " in out and "| 512 |" in out
    stored = list(tmp_path.glob("*.json"))
    assert len(stored) == 1
    # The server/engine with the same settings now starts from that fit.
    llm = LLM(tiny_model_dir, calibration_cache_dir=str(tmp_path), max_num_batched_tokens=256)
    assert llm.engine.cost.source == f"cached:{stored[0]}"


def test_calibration_lengths_reach_the_longest_prefill():
    """The long end shows the attention term: the lengths end at the cap (32k on a GPU), not at 8k."""
    assert calibration_lengths(32768) == [512, 1024, 2048, 4096, 8192, 16384, 32768]
    assert calibration_lengths(1024) == [128, 256, 512, 1024]
    assert calibration_lengths(40000)[-2:] == [32768, 40000] and len(calibration_lengths(40000)) == 7
    assert calibration_lengths(100) == [50, 100]
