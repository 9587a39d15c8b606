"""`fit-profile --results` measures the host tier's call costs from the runs' server metrics
(sim/fit_host.py), and `--host-earlier` those of an engine built before a time, on the recorded real-size
runs: the profile it writes carries the costs that were set by hand from the same counters."""

import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flashstate.cli import main
from flashstate.sim.fit_host import fit_host_calls
from flashstate.sim.profile import load_profile

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
HOST_RUN = RESULTS / "card-2026-12-05/real-size-0.15"  # flashstate + host tier
PLAIN_RUN = RESULTS / "card-2026-12-05/real-size-0.15-ablation"  # no host tier
EARLIER_RUN = RESULTS / "card-2026-12-04/real-size-0.15"  # before the ISA-L checksum
FITTED = RESULTS / "card-2026-12-06/h200-qwen3.6-35b-a3b-fit.json"  # its host section set by hand


def test_the_host_calls_come_from_the_runs_that_restored(tmp_path, capsys):
    out = tmp_path / "fit.json"
    argv = [
        "fit-profile",
        str(HOST_RUN / "steps-flashstate-host.jsonl.gz"),
        str(PLAIN_RUN / "steps-asc-gds.jsonl.gz"),
        "--base",
        str(RESULTS / "card-2026-12-04/h200-qwen3.6-35b-a3b-rough.json"),
        "--results",
        str(HOST_RUN / "result-flashstate-host.json.gz"),
        str(PLAIN_RUN / "result-asc-gds.json.gz"),
        "--host-earlier",
        "2026-12-04T20:55",
        str(EARLIER_RUN / "result-flashstate-host.json.gz"),
        "--out",
        str(out),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    got, want = load_profile(str(out)), load_profile(str(FITTED))
    assert got.host_calls_in_steps is False
    for name in ("lookup_s_per_token", "restore_s_per_token", "load_s_per_token", "write_back_s"):
        assert getattr(got.host_calls, name) == pytest.approx(getattr(want.host_calls, name), rel=5e-3)
        (until, g), (_, w) = got.earlier_host_calls[0], want.earlier_host_calls[0]
        assert getattr(g, name) == pytest.approx(getattr(w, name), rel=5e-3)
    assert until == datetime(2026, 12, 4, 20, 55, tzinfo=UTC)
    # a replay of the earlier run prices its restores at that engine's costs
    assert got.as_of(datetime(2026, 12, 4, 12, tzinfo=UTC)).host_calls.restore_s_per_token > 1.8e-6
    assert "11,107,659 restored tokens" in got.provenance and "before 2026-12-04T20:55" in got.provenance


def test_runs_without_restores_leave_the_base_costs(tmp_path, capsys):
    result = json.loads(_gunzip(PLAIN_RUN / "result-asc-gds.json.gz"))
    assert fit_host_calls([result]) is None
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(result))
    out = tmp_path / "p.json"
    argv = ["fit-profile", str(PLAIN_RUN / "steps-asc-gds.jsonl.gz"), "--base", str(FITTED), "--results",
            str(path), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    got, base = load_profile(str(out)), load_profile(str(FITTED))
    assert got.host_calls == base.host_calls and got.earlier_host_calls == base.earlier_host_calls


def test_restores_read_ahead_are_refused(tmp_path, capsys):
    result = json.loads(_gunzip(HOST_RUN / "result-flashstate-host.json.gz"))
    delta = result["server_metrics"]["delta"]
    key = next(k for k in delta if k.startswith("flashstate:host_cache_prefetches_total"))
    delta[key] = 12.0
    with pytest.raises(ValueError, match="read restores ahead"):
        fit_host_calls([result])
    plain = str(PLAIN_RUN / "result-asc-gds.json.gz")
    argv = ["fit-profile", str(HOST_RUN / "steps-flashstate-host.jsonl.gz"), "--host-earlier",
            "2026-12-04T20:55", plain, "--out", str(tmp_path / "p.json")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "none of" in err and "restored from a host tier" in err and err.count("\n") == 1


def _gunzip(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode()
