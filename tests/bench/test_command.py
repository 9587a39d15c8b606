"""`flashstate bench` through the CLI, against fake servers run as processes (tests/bench/fake_server.py)."""

import json
import shlex
import sys
from pathlib import Path

import pytest

from flashstate.bench.compare import ServerError, ServerSpec, server_process
from flashstate.cli import main

FAKE = ServerSpec(entry=(str(Path(__file__).with_name("fake_server.py")),), startup_timeout_s=30)
FAST = shlex.split("--agents 2 --warmup 0 --duration 30 --max-sessions 3 --time-scale 0 --no-progress")


@pytest.fixture
def trace(tmp_path):
    """A one-session AgentX file (two turns, two sub-agents, two more turns)."""
    from .test_workloads import agentx_doc

    path = tmp_path / "trace.json"
    path.write_text(json.dumps(agentx_doc()))
    return str(path)


def test_bench_run_writes_result_report_and_plots(tmp_path, trace, capsys):
    with server_process(FAKE, "flashstate", tmp_path / "server.log") as (url, cmd):
        assert cmd[1].endswith("fake_server.py") and cmd[2:4] == ["--host", "127.0.0.1"]
        rc = main(["bench", "run", "--url", url, "--workload", trace, "--out", str(tmp_path / "out"), *FAST])
        assert rc == 0
        rc = main(["bench", "run", "--url", url, "--out", str(tmp_path / "syn"), "--length-scale", "auto",
                   "--max-context", "2000", "--max-requests", "4", *FAST])  # fmt: skip
        assert rc == 0
    doc = json.loads((tmp_path / "out" / "result-run.json").read_text())
    assert doc["workload"] == {"kind": "agentx", "source": trace, "sessions": 1, "split": None, "seed": 0,
                               "requests": 7}  # fmt: skip
    assert doc["replay"]["agents"] == 2 and doc["summary"]["completed_agents"] == 3
    assert {r["session"] for r in doc["requests"]} == {"s1#0", "s1#0/a1", "s1#0/a2", "s1#1", "s1#1/a1",
                                                       "s1#1/a2", "s1#2", "s1#2/a1", "s1#2/a2"}  # fmt: skip
    syn = json.loads((tmp_path / "syn" / "result-run.json").read_text())
    assert syn["workload"]["kind"] == "synthetic" and syn["scale"]["length_scale_auto"]
    assert 0 < syn["scale"]["length_scale"] < 0.05 and syn["summary"]["requests"] == 4
    assert doc["server_metrics"]["cross_check"]["equal"]
    assert (tmp_path / "out" / "ttft_cdf.png").stat().st_size > 0
    assert "| token hit rate |" in capsys.readouterr().out


def test_bench_compare_one_server_per_policy(tmp_path, trace, monkeypatch, capsys):
    monkeypatch.setattr("flashstate.bench.command.ServerSpec", lambda args, timeout: FAKE)
    out = tmp_path / "cmp"
    policies = "flashstate,vllm,none"
    variant = ["--variant", "echo=none --echo-ids"]  # a named run with flags of its own
    rc = main(
        ["bench", "compare", "--policies", policies, *variant, "--workload", trace, "--out", str(out), *FAST]
    )
    assert rc == 0
    doc = json.loads((out / "compare.json").read_text())
    assert doc["policies"] == ["flashstate", "vllm", "none", "echo"] and doc["reference"] == "vllm"
    echo = doc["results"].pop("echo")["server"]
    assert echo["cache_policy"] == "none" and "--echo-ids" in echo["command"]
    doc["policies"].remove("echo")
    hit = {p: doc["results"][p]["summary"]["token_hit_rate"] for p in doc["policies"]}
    assert hit["flashstate"] > hit["vllm"] > hit["none"] == 0.0
    servers = {p: doc["results"][p]["server"] for p in doc["policies"]}
    assert len({s["base_url"] for s in servers.values()}) == 3  # a fresh server each
    assert all(s["command"][s["command"].index("--cache-policy") + 1] == p for p, s in servers.items())
    assert (out / "server-none.log").exists()
    assert "Times better than `vllm`" in capsys.readouterr().out


def test_a_compare_cut_short_keeps_the_results_it_finished(tmp_path, trace, monkeypatch):
    monkeypatch.setattr("flashstate.bench.command.ServerSpec", lambda args, timeout: FAKE)
    out = tmp_path / "cmp"
    broken = ["--variant", "broken=none --no-such-flag"]  # the fake server refuses it and exits
    args = ["bench", "compare", "--policies", "flashstate", *broken, "--workload", trace, "--out", str(out)]
    assert main([*args, *FAST]) != 0
    doc = json.loads((out / "result-flashstate.json").read_text())
    assert doc["label"] == "flashstate" and doc["summary"]["requests"] > 0
    assert not (out / "result-broken.json").exists()


def test_bench_stats_prints_the_fit(trace, capsys):
    assert main(["bench", "stats", trace]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sessions"] == 1 and doc["agents"]["turns"]["p50"] == 4.0 and "fitted" in doc


def test_bench_errors_are_reported(tmp_path, capsys):
    assert main(["bench", "run", "--workload", str(tmp_path / "missing"), "--no-progress"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["bench", "compare", "--policies", "lru"]) == 2
    assert "unknown cache policy ['lru']" in capsys.readouterr().err
    assert main(["bench", "compare", "--variant", "noname --x"]) == 2
    assert "NAME=POLICY" in capsys.readouterr().err
    assert main(["bench", "compare", "--policies", "vllm", "--variant", "vllm=flashstate"]) == 2
    assert "distinct names" in capsys.readouterr().err
    assert main(["bench", "compare", "--reference", "sglang"]) == 2
    assert "none of the compared runs" in capsys.readouterr().err


def test_server_that_dies_is_reported(tmp_path):
    spec = ServerSpec(python=sys.executable, entry=("-c", "import sys; sys.exit(3)"), startup_timeout_s=10)
    with pytest.raises(ServerError, match="status 3"), server_process(spec, "vllm", tmp_path / "log"):
        pass


BUSY_PORT_ONCE = """
import runpy, sys
from pathlib import Path
marker = Path(sys.argv.pop())
if not marker.exists():  # the first start finds its port taken, as when another process got there first
    marker.write_text("")
    print("ERROR: [Errno 98] error while attempting to bind on address: address already in use")
    sys.exit(1)
sys.argv[0] = FAKE_SERVER
runpy.run_path(FAKE_SERVER, run_name="__main__")
"""


def test_a_server_whose_port_was_taken_is_started_again_on_another(tmp_path):
    fake = str(Path(__file__).with_name("fake_server.py"))
    script = f"FAKE_SERVER = {fake!r}\n{BUSY_PORT_ONCE}"
    spec = ServerSpec((str(tmp_path / "marker"),), startup_timeout_s=30, entry=("-c", script))
    with server_process(spec, "vllm", tmp_path / "log") as (url, cmd):
        assert (tmp_path / "marker").exists() and url.endswith(cmd[cmd.index("--port") + 1])
