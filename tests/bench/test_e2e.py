"""`flashstate bench` against real `flashstate serve` processes (embedded tiny model, CPU, 127.0.0.1)."""

import json
import re

import httpx
import pytest

from flashstate.bench.compare import ServerSpec, server_process
from flashstate.cli import main

SMALL = "--agents 2 --warmup 0 --duration 120 --max-requests 8 --length-scale 0.01 --time-scale 0 "
SMALL = (SMALL + "--max-output-tokens 4 --no-progress").split()
SERVE = "--device cpu --max-num-seqs 4 --max-model-len 8192"


def test_compare_flashstate_vs_vllm_on_real_servers(tmp_path, capsys):
    """Two rounds, the second in reversed order: each metric's median and spread over them."""
    out = tmp_path / "cmp"
    rc = main(["bench", "compare", "--policies", "flashstate,vllm", "--serve-args", SERVE, "--out", str(out),
               "--rounds", "2", *SMALL])  # fmt: skip
    assert rc == 0
    started = re.findall(r"== (\S+): starting the server", capsys.readouterr().err)
    assert started == ["flashstate-round1", "vllm-round1", "vllm-round2", "flashstate-round2"]
    report = (out / "report.md").read_text()
    assert "median over the rounds" in report and "Spread over the rounds (min – max)" in report
    doc = json.loads((out / "compare.json").read_text())
    for policy in ("flashstate", "vllm"):
        r = doc["results"][policy]
        assert [x["summary"]["requests"] for x in r["rounds"]] == [8, 8]
        assert r["rounds"][0]["summary"] == r["summary"]  # the document is the first round's
        assert r["summary"]["requests"] == 8 and r["summary"]["errors"] == 0
        assert r["server"]["model"] == "flashstate-tiny" and r["scale"]["max_context"] == 8192
        check = r["server_metrics"]["cross_check"]
        assert check["equal"], check  # client-side cached tokens = the server's prefix_cache_hits
        assert r["summary"]["ttft_s"]["p50"] > 0
        steps = r["server"]["steps"]  # from the server's step trace
        assert steps["prefill_steps"] > 0 and steps["decode_steps"] > 0
        assert 0 < steps["busy_fraction"] <= 1 and steps["prefill_tok_per_s_in_prefill_steps"] > 0
    hit = {p: doc["results"][p]["summary"]["token_hit_rate"] for p in ("flashstate", "vllm")}
    assert hit["flashstate"] >= hit["vllm"] and hit["flashstate"] > 0.5
    for name in ("report.md", "hit_rate.png", "ttft_cdf.png", "output_tokens.png", "result-vllm.json"):
        assert (out / name).stat().st_size > 0


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with server_process(ServerSpec(tuple(SERVE.split())), "flashstate", log) as (url, _):
        yield url


def test_run_in_completions_and_chat_mode_on_a_real_server(real_server, tmp_path):
    for mode, extra in (("completions", ["--subagent-prob", "0.5"]), ("chat", [])):
        out = tmp_path / mode
        args = ["--url", real_server, "--mode", mode, "--out", str(out), *extra, *SMALL]
        assert main(["bench", "run", *args]) == 0
        r = json.loads((out / "result-run.json").read_text())
        summary = r["summary"]
        assert summary["requests"] + summary["too_long"] == 8 and summary["errors"] == 0
        assert r["server_metrics"]["cross_check"]["equal"]
        later = [q for q in r["requests"] if q["turn"] > 0 and not q["too_long"]]
        assert later and all(q["cached_tokens"] > 0 for q in later)  # each turn resumes the last
        if mode == "completions":
            assert any(q["depth"] == 1 for q in r["requests"])  # sub-agents ran
        else:
            assert all(q["echoed"] for q in r["requests"] if not q["too_long"])  # assistant text kept


def test_the_prefill_cost_source_label_is_a_kind_not_a_path(real_server):
    """The server calibrated C(n) (or fell back to the default on a busy machine): /metrics says which."""
    text = httpx.get(f"{real_server}/metrics", timeout=30).text
    lines = [ln for ln in text.splitlines() if ln.startswith("flashstate:prefill_cost_coefficient{")]
    sources = {re.search(r'source="([^"]*)"', ln).group(1) for ln in lines}
    assert len(lines) == 2 and len(sources) == 1 and sources <= {"measured", "cached", "default"}, lines


def test_mooncake_trace_on_a_real_server(real_server, tmp_path):
    rows = [
        {
            "timestamp": 0,
            "input_length": 300,
            "output_length": 4,
            "hash_ids": list(range(18)),
            "session_id": 1,
        },
        {
            "timestamp": 0,
            "input_length": 200,
            "output_length": 4,
            "hash_ids": list(range(12)),
            "session_id": 2,
        },
        {
            "timestamp": 500,
            "input_length": 340,
            "output_length": 4,
            "hash_ids": list(range(21)),
            "session_id": 1,
        },
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--workload", str(path), "--trace-block-size", "16", "--max-sessions", "2", "--time-scale", "0"]
    args += ["--warmup", "0"]
    assert main(["bench", "run", "--url", real_server, "--out", str(tmp_path), *args, "--no-progress"]) == 0
    r = json.loads((tmp_path / "result-run.json").read_text())
    assert r["workload"]["kind"] == "mooncake" and r["summary"]["completed_agents"] == 2
    turns = {(q["session"].split("#")[0], q["turn"]): q for q in r["requests"]}
    assert turns[("1", 1)]["prompt_tokens"] == 340 and turns[("1", 1)]["cached_tokens"] >= 288
    assert r["server_metrics"]["cross_check"]["equal"]


def test_real_claude_code_trace_with_subagents_on_a_real_server(real_server, traces, tmp_path):
    """trace_0277: three sub-agents after the first turn, joined before the second."""
    args = [
        "--workload",
        str(traces / "trace_0277.json.gz"),
        "--max-requests",
        "6",
        "--length-scale",
        "0.005",
    ]
    args += [
        "--agents",
        "1",
        "--warmup",
        "0",
        "--time-scale",
        "0",
        "--max-output-tokens",
        "4",
        "--no-progress",
    ]
    assert main(["bench", "run", "--url", real_server, "--out", str(tmp_path), *args]) == 0
    r = json.loads((tmp_path / "result-run.json").read_text())
    assert r["workload"]["kind"] == "agentx" and r["summary"]["errors"] == 0
    order = [(q["session"], q["turn"]) for q in sorted(r["requests"], key=lambda q: q["t_send"])]
    assert order[0] == ("trace_0277#0", 0)
    assert {s for s, _ in order[1:4]} == {f"trace_0277#0/agent_00{i}" for i in (1, 2, 3)}  # concurrently
    assert r["server_metrics"]["cross_check"]["equal"]
