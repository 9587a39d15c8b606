"""`flashstate simulate` end to end: flags as `bench compare`'s, results the bench report code reads."""

import json

from flashstate.bench.report import RESULT_SCHEMA, markdown, plots
from flashstate.cli import main


def test_simulate_writes_bench_results(tmp_path, capsys):
    out = tmp_path / "sim"
    rc = main(
        [
            "simulate",
            "--policies",
            "flashstate,vllm",
            "--agents",
            "3",
            "--warmup",
            "0",
            "--duration",
            "300",
            "--seed",
            "1",
            "--serve-args",
            "--kv-cache-memory-bytes 2G --max-num-seqs 8",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert "| token hit rate |" in capsys.readouterr().out
    results = {}
    for policy in ("flashstate", "vllm"):
        doc = json.loads((out / f"result-{policy}.json").read_text())
        assert doc["schema"] == RESULT_SCHEMA and doc["label"] == policy
        assert doc["server"]["cache_policy"] == policy
        sim = doc["server"]["simulated"]
        assert sim["profile"] == "h200-qwen3-next-2b" and "provisional" in sim["provenance"]
        assert "2.0 GiB" in sim["cache_plan"] or "KV cache" in sim["cache_plan"]
        assert doc["summary"]["requests"] > 0 and doc["requests"]
        results[policy] = doc
    compare = json.loads((out / "compare.json").read_text())
    assert compare["reference"] == "vllm" and compare["policies"] == ["flashstate", "vllm"]
    assert "| TTFT p90 (s) |" in markdown(results, "vllm")
    assert [p.name for p in plots(results, tmp_path / "again")] == [
        "hit_rate.png",
        "ttft_cdf.png",
        "output_tokens.png",
    ]


def test_bad_input_is_one_line(tmp_path, capsys):
    for argv, words in (
        (["--profile", str(tmp_path / "nope.json")], "no such file"),
        (["--policies", "lru"], "--policies"),
        (["--serve-args", "--max-num-seqs zero"], "--serve-args"),
        (["--workload", str(tmp_path / "missing")], "missing"),
    ):
        assert main(["simulate", "--out", str(tmp_path / "o"), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("flashstate simulate: error:") and words in err[0]
