import json
from pathlib import Path

import pytest

from flashstate.cache.cost import PrefillCost
from flashstate.sim.profile import DEFAULT_PROFILE, ProfileError, load_profile


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
