import json
import random
from dataclasses import asdict
from pathlib import Path

import pytest

from flashstate.cache.cost import PrefillCost
from flashstate.cli import main
from flashstate.sim.command import engine_config, make_engines
from flashstate.sim.events import EventLoop
from flashstate.sim.profile import DEFAULT_PROFILE, ProfileError, StepNoise, load_profile, utc_time


def test_shipped_profile_loads_with_its_provenance():
    p = load_profile(DEFAULT_PROFILE)
    assert p.model == "qwen3-next-2b"
    assert "step traces" in p.provenance and "held out" in p.provenance
    # The stored a, b: the FIELD-NOTES prefill rates they were fitted to, slowed 1.8× to the serving rate
    # (within 1%); the fit is what the points give.
    for tokens, rate in ((8192, 121e3), (32768, 107e3), (131072, 73e3)):
        assert p.prefill(tokens) == pytest.approx(1.8 * tokens / rate, rel=0.01)
    # Decode: the serving fit, 3.23 ms + 0.456 ms per sequence, growing with the batch.
    assert p.decode(1, 1000) < p.decode(2, 1000)
    assert p.decode(48, 48 * 30_000) == pytest.approx(3.23e-3 + 48 * 4.56e-4)
    assert p.decode(0, 0) == 0.0


def _write(tmp_path, doc):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _doc(**kw):
    doc = {
        "schema": "flashstate.sim.profile/1",
        "model": "tiny",
        "memory": {"cache_bytes": 1 << 30},
        "prefill": {"points": [[1000, 0.01], [4000, 0.05], [16000, 0.3]]},
        "decode": {"base_s": 0.001, "per_seq_s": 0.0, "per_token_s": 0.0},
    }
    return doc | kw


def test_user_profile_fits_prefill_from_points(tmp_path):
    p = load_profile(_write(tmp_path, _doc()))
    want = PrefillCost.fit([1000, 4000, 16000], [0.01, 0.05, 0.3])
    assert (p.prefill.a, p.prefill.b) == pytest.approx((want.a, want.b))
    assert p.serve_args()[:2] == ["--kv-cache-memory-bytes", str(1 << 30)]


@pytest.mark.parametrize(
    "change, field",
    [
        ({"schema": "x"}, "schema"),
        ({"model": None}, "model"),
        ({"memory": {}}, "cache_bytes"),
        ({"prefill": {"points": [[1000, 0.01]]}}, "prefill"),
        ({"decode": {"base_s": -1, "per_seq_s": 0, "per_token_s": 0}}, "base_s"),
        ({"engine_args": "--max-num-seqs 4"}, "engine_args"),
        ({"prefill": {"a": 1e-6, "b": 1e-11, "graphed_step_s": -1}}, "graphed_step_s"),
        ({"noise": {"prefill_sd": -0.1}}, r"noise\.prefill_sd"),
        ({"noise": {"sd": 0.1}}, r"noise: unknown field\(s\) sd"),
    ],
)
def test_bad_profile_names_the_field(tmp_path, change, field):
    with pytest.raises(ProfileError, match=field):
        load_profile(_write(tmp_path, _doc(**change)))


def test_unknown_profile_lists_the_shipped_ones():
    with pytest.raises(ProfileError, match=DEFAULT_PROFILE):
        load_profile("no-such-profile")


def test_graphed_steps_hold_the_exports_of_the_engine_the_profile_was_measured_on(tmp_path):
    """The served profile predates exports in mixed-step buckets (0); a profile that does not say takes the
    engine's own capacity."""
    from flashstate.engine.step_shapes import MAX_EXPORTS

    served = load_profile("h200-qwen3-next-2b-served")
    assert served.graphed_step_s is not None and served.graphed_max_exports == 0
    doc = json.loads(Path(served.path).read_text())
    del doc["prefill"]["graphed_max_exports"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    assert load_profile(str(path)).graphed_max_exports == MAX_EXPORTS


def test_step_costs_scale_but_the_engines_cost_model_stays(tmp_path, capsys):
    base = load_profile(_write(tmp_path, _doc(engine_args=[])))  # no given coefficients: prefill is the cost
    scaled = base.with_step_costs_scaled(1.5).with_step_costs_scaled(2.0)
    assert scaled.step_cost_scale == 3.0 and scaled.engine_cost == base.prefill
    assert scaled.prefill(4000) == pytest.approx(3 * base.prefill(4000))
    assert scaled.decode(8, 80_000) == pytest.approx(3 * base.decode(8, 80_000))
    engine = make_engines(scaled, engine_config(scaled, [], "flashstate"), 1, EventLoop())[0]
    assert engine.cache.policy.cost == base.prefill  # what the cache prices evictions in: the measured C(n)
    with pytest.raises(ProfileError, match="--step-cost-scale"):
        base.with_step_costs_scaled(0.0)

    # through the command: the same run takes longer on the engine, and the result says by how much
    busy = {}
    for scale in ("1", "1.5"):
        out = tmp_path / f"x{scale}"
        argv = ["simulate", "--policies", "vllm", "--agents", "2", "--duration", "200", "--seed", "1"]
        assert main([*argv, "--step-cost-scale", scale, "--out", str(out)]) == 0
        sim = json.loads((out / "result-vllm.json").read_text())["server"]["simulated"]
        assert sim["step_cost_scale"] == float(scale)
        busy[scale] = sim["engine_busy_s"]
    assert busy["1.5"] > busy["1"]
    capsys.readouterr()
    assert main(["simulate", "--step-cost-scale", "-1", "--out", str(tmp_path / "bad")]) == 2
    assert "--step-cost-scale" in capsys.readouterr().err


def test_a_replay_prices_the_host_tiers_calls_as_the_engine_of_its_time(tmp_path, capsys):
    """The tune profile dates its host-tier call costs: an engine built before the checksum change had the
    costlier calls, and `--engine-as-of` (which a recorded run's replay passes) picks them."""
    tune = load_profile("h200-qwen3-next-2b-tune")
    (until, then), *_ = tune.earlier_host_calls
    assert tune.as_of(utc_time("2026-12-04T15:55:37+00:00", "t")).host_calls == then
    assert tune.as_of(utc_time("2026-12-05T02:14:03", "t")).host_calls == tune.host_calls  # no offset: UTC
    assert then.restore_s_per_token > tune.host_calls.restore_s_per_token
    with pytest.raises(ProfileError, match="host.earlier"):
        load_profile(_write(tmp_path, _doc(host={"earlier": [{"until": "2026-12-04", "lookup": 1}]})))

    # through the command: a host-tier run before `until` costs the engine thread more in the tier's calls
    seconds = {}
    for when in ("2026-12-04T00:00", "2026-12-05T00:00"):
        out = tmp_path / when.replace(":", "")
        argv = ["simulate", "--profile", "h200-qwen3-next-2b-tune", "--agents", "4", "--duration", "120"]
        argv += ["--policies", "", "--variant", "h=flashstate --host-cache memory --host-cache-bytes 8G"]
        argv += [
            "--serve-args",
            "--kv-cache-memory-bytes 4G --max-num-seqs 8",
            "--seed",
            "1",
            "--engine-as-of",
            when,
        ]
        assert main([*argv, "--out", str(out)]) == 0
        sim = json.loads((out / "result-h.json").read_text())["server"]["simulated"]
        seconds[when] = sim["cache_stats"][0]["host_engine_s_by_call"]
        assert (
            sim["host_calls"]["restore_s_per_token"]
            == (then if utc_time(when, "t") < until else tune.host_calls).restore_s_per_token
        )
    assert seconds["2026-12-04T00:00"]["write_back"] > seconds["2026-12-05T00:00"]["write_back"] > 0
    capsys.readouterr()
    # a time that is none is refused, naming the flag, not compared as text
    assert main(["simulate", "--engine-as-of", "yesterday", "--out", str(tmp_path / "bad")]) == 2
    assert "--engine-as-of" in capsys.readouterr().err
    with pytest.raises(ProfileError, match=r"earlier\[0\]\.until"):
        load_profile(
            _write(tmp_path, _doc(host={"earlier": [{"until": "soon", "lookup_s_per_token": 1e-8}]}))
        )


def test_steps_stray_around_their_price_by_the_seed_of_the_noise(tmp_path, capsys):
    """A profile with noise draws each step's time around its price (a factor of mean 1): the same seed gives
    the same run, another seed another run, and --no-step-noise the run at the price."""
    noise = StepNoise(prefill_sd=0.15, decode_sd=0.25)
    rng = random.Random(1)
    factors = [noise.factor(rng, decode) for decode in (True, False) for _ in range(20_000)]
    assert sum(factors) / len(factors) == pytest.approx(1.0, abs=0.01) and min(factors) > 0
    assert StepNoise().factor(rng, True) == 1.0

    path = _write(tmp_path, _doc(engine_args=[], noise={"prefill_sd": 0.15, "decode_sd": 0.25}))
    assert load_profile(path).noise == noise
    busy = {}
    for name, flags in {"a": ["--step-noise-seed", "1"], "b": ["--step-noise-seed", "1"],
                        "c": ["--step-noise-seed", "2"], "off": ["--no-step-noise"]}.items():  # fmt: skip
        out = tmp_path / name
        argv = ["simulate", "--profile", path, "--policies", "vllm", "--agents", "2", "--duration", "200"]
        assert main([*argv, "--seed", "1", *flags, "--out", str(out)]) == 0
        result = json.loads((out / "result-vllm.json").read_text())
        busy[name] = result["server"]["simulated"]["engine_busy_s"]
        assert result["server"]["simulated"]["noise"] == (
            {"prefill_sd": 0.0, "decode_sd": 0.0} if name == "off" else asdict(noise)
        )
    assert busy["a"] == busy["b"] != busy["c"]
    steady = tmp_path / "steady.json"
    steady.write_text(json.dumps(_doc(engine_args=[])))
    out = tmp_path / "steady"
    argv = ["simulate", "--profile", str(steady), "--policies", "vllm", "--agents", "2", "--duration", "200"]
    assert main([*argv, "--seed", "1", "--out", str(out)]) == 0
    assert (
        json.loads((out / "result-vllm.json").read_text())["server"]["simulated"]["engine_busy_s"]
        == busy["off"]
    )
    # a seed with no noise to seed is refused, naming why
    for prof, flags, why in (
        (str(steady), [], "has no step noise"),
        (path, ["--no-step-noise"], "--no-step-noise"),
    ):
        capsys.readouterr()
        argv = ["simulate", "--profile", prof, "--policies", "vllm", "--step-noise-seed", "3", *flags]
        assert main([*argv, "--out", str(tmp_path / "refused")]) == 2
        assert "--step-noise-seed" in (err := capsys.readouterr().err) and why in err
    assert not (tmp_path / "refused").exists()
