"""`flashstate simulate` end to end: flags as `bench compare`'s, results the bench report code reads."""

import gzip
import json

from flashstate.bench.report import RESULT_SCHEMA, markdown, plots
from flashstate.bench.step_summary import read_trace, summarize
from flashstate.cli import main


def test_simulate_writes_bench_results(tmp_path, capsys):
    out = tmp_path / "sim"
    rc = main(
        [
            "simulate",
            "--policies",
            "flashstate,vllm",
            "--variant",
            "aligned=flashstate --mamba-checkpoint-placement aligned",
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
        assert sim["profile"] == "h200-qwen3-next-2b" and "step traces" in sim["provenance"]
        assert "KV" in sim["cache_plan"] and "checkpoint" in sim["cache_plan"]
        steps = sim["steps"]  # the same summary `bench compare` makes of a server's step trace
        assert steps["steps"] == sim["engine_steps"] and steps["prefill_steps"] > 0
        assert 0 < steps["busy_fraction"] <= 1
        parts = steps["ttft_parts"]  # as `bench compare` summarises a server's request lines
        assert parts["requests"] > 0 and parts["queued"]["mean"] >= 0 and parts["to_first_step"]["p50"] > 0
        assert doc["summary"]["requests"] > 0 and doc["requests"]
        results[policy] = doc
    aligned = json.loads((out / "result-aligned.json").read_text())
    assert aligned["server"]["cache_policy"] == "flashstate" and aligned["label"] == "aligned"
    assert aligned["server"]["serve_args"] == ["--mamba-checkpoint-placement", "aligned"]
    compare = json.loads((out / "compare.json").read_text())
    assert compare["reference"] == "vllm" and compare["policies"] == ["flashstate", "vllm", "aligned"]
    assert "| TTFT p90 (s) |" in markdown(results, "vllm")
    assert [p.name for p in plots(results, tmp_path / "again")] == [
        "hit_rate.png",
        "ttft_cdf.png",
        "output_tokens.png",
    ]

    # results of separate runs merge into one report
    merged = tmp_path / "merged"
    argv = ["bench", "report", str(out / "result-vllm.json"), str(out / "result-aligned.json")]
    assert main([*argv, "--reference", "aligned", "--out", str(merged)]) == 0
    compare = json.loads((merged / "compare.json").read_text())
    assert compare["reference"] == "aligned" and compare["policies"] == ["vllm", "aligned"]
    assert "| token hit rate |" in (merged / "report.md").read_text()
    # a run directory keeps its own order (compare.json's), not the file names'
    assert main(["bench", "report", str(out), "--out", str(merged)]) == 0
    assert json.loads((merged / "compare.json").read_text())["policies"] == ["flashstate", "vllm", "aligned"]
    capsys.readouterr()
    assert main(["bench", "report", str(out), str(out / "result-vllm.json"), "--out", str(merged)]) == 2
    assert "two results are labelled 'vllm'" in capsys.readouterr().err

    # gzipped results (as committed under benchmarks/results) read the same; --whole-run reads every run
    # from its first send to the drain's end
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "result-vllm.json.gz").write_bytes(gzip.compress((out / "result-vllm.json").read_bytes()))
    whole = tmp_path / "whole"
    argv = ["bench", "report", str(packed), str(out / "result-aligned.json"), "--whole-run"]
    assert main([*argv, "--out", str(whole)]) == 0
    doc = json.loads((whole / "result-vllm.json").read_text())
    answered = [r for r in doc["requests"] if r["error"] is None and r["e2e"] is not None]
    assert doc["window"] == "whole run" and doc["timeline"]["window"] == [0.0, doc["wall_s"]]
    assert doc["summary"]["requests"] == len(answered) and doc["summary"]["window_s"] == doc["wall_s"]
    assert doc["summary"]["output_tokens"] == sum(r["output_tokens"] for r in answered)
    assert "read over the whole run" in (whole / "report.md").read_text()


def test_simulate_writes_the_step_trace_a_server_keeps(tmp_path):
    """`--step-trace`: steps-<label>.jsonl.gz beside the result, a row per step and a line per finished
    request as a server's `--step-trace` writes them (counts as the step left them), which the result's
    step summary and `fit-profile` read."""
    out = tmp_path / "sim"
    argv = ["simulate", "--policies", "flashstate", "--agents", "3", "--warmup", "0", "--duration", "300",
            "--seed", "1", "--serve-args", "--kv-cache-memory-bytes 2G --max-num-seqs 8", "--step-trace",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    steps, requests = read_trace(out / "steps-flashstate.jsonl.gz")
    sim = json.loads((out / "result-flashstate.json").read_text())["server"]["simulated"]
    assert len(steps) == sim["engine_steps"] and summarize(steps, requests) == sim["steps"]
    assert len(requests) == sim["steps"]["ttft_parts"]["requests"] > 0
    assert steps[-1]["running"] == steps[-1]["waiting"] == 0  # the last step left nothing behind
    # the states each step checkpoints, as a server's rows count them: flashstate's prefills export some
    assert (
        all(r["exports"] >= 0 for r in steps) and sum(r["exports"] for r in steps if r["prefill_tokens"]) > 0
    )
    assert not any(r["exports"] for r in steps if not r["prefill_tokens"])
    trace = out / "steps-flashstate.jsonl.gz"
    assert main(["fit-profile", str(trace), "--out", str(tmp_path / "p.json")]) == 0


def test_bad_input_is_one_line(tmp_path, capsys):
    for argv, words in (
        (["--profile", str(tmp_path / "nope.json")], "no such file"),
        (["--policies", "lru"], "unknown cache policy"),
        (["--variant", "x=flashstate --max-num-seqs zero"], "--serve-args"),
        (["--reference", "sglang"], "--reference"),
        (["--serve-args", "--max-num-seqs zero"], "--serve-args"),
        (["--workload", str(tmp_path / "missing")], "missing"),
        (["--chat-unspliced-per-token", "1"], "[0, 1)"),
        (["--chat-unspliced-per-token", "0.001"], "needs --mode chat"),
    ):
        assert main(["simulate", "--out", str(tmp_path / "o"), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("flashstate simulate: error:") and words in err[0]
