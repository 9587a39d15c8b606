import json

from flashstate.bench.cost import Prices
from flashstate.bench.report import COMPARE_SCHEMA, RESULT_SCHEMA, build_result, markdown, ratio, write_report

from .fake_server import FakeServer
from .helpers import chain, run

SCALE = {"length_scale": 1.0, "length_scale_auto": False, "time_scale": 0.0, "max_think_s": None,
         "max_output_tokens": None}  # fmt: skip


def result(policy: str) -> dict:
    res = run(FakeServer(policy=policy, block=4), [chain("a", 4), chain("b", 4)], agents=2, max_sessions=2,
              time_scale=0.0)  # fmt: skip
    return build_result(res, policy, {"kind": "test", "source": "helpers.chain"}, SCALE, Prices())


def test_result_document_and_cross_check():
    r = result("flashstate")
    assert r["schema"] == RESULT_SCHEMA and r["label"] == "flashstate"
    assert r["scale"]["max_context"] == 100_000 and r["server"]["model"] == "fake"
    assert r["summary"]["requests"] == len(r["requests"]) == 8 and r["summary"]["completed_agents"] == 2
    check = r["server_metrics"]["cross_check"]
    assert check["equal"] and check["client_cached_tokens"] == check["server_cached_tokens"] > 0
    assert r["cost"]["user_bill_per_session"] > 0
    assert sum(r["timeline"]["output_tokens"]) == sum(q["output_tokens"] for q in r["requests"])
    json.dumps(r)  # plain JSON


def test_side_by_side_report_with_ratios_and_plots(tmp_path):
    results = {"flashstate": result("flashstate"), "vllm": result("vllm"), "none": result("none")}
    md = markdown(results, "vllm", "demo")
    assert "| metric | flashstate | vllm | none |" in md
    hit = {k: r["summary"]["token_hit_rate"] for k, r in results.items()}
    assert hit["flashstate"] > hit["vllm"] > hit["none"] == 0
    assert f"| token hit rate | {hit['flashstate']:.1%} | {hit['vllm']:.1%} | 0.0% |" in md
    assert "Times better than `vllm`" in md and f"{hit['flashstate'] / hit['vllm']:.2f}×" in md
    files = write_report(tmp_path, results, "vllm", "demo")
    assert {p.name for p in tmp_path.iterdir()} == {
        "result-flashstate.json", "result-vllm.json", "result-none.json", "compare.json", "report.md",
        "hit_rate.png", "ttft_cdf.png", "output_tokens.png",
    }  # fmt: skip
    doc = json.loads(files["compare"].read_text())
    assert doc["schema"] == COMPARE_SCHEMA and doc["policies"] == ["flashstate", "vllm", "none"]
    assert "requests" not in doc["results"]["vllm"]  # per-request records stay in result-<policy>.json
    for name in ("hit_rate", "ttft_cdf", "output_tokens"):
        assert files[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ratio_direction():
    assert ratio(0.9, 0.3, lower_is_better=False) == 3.0
    assert ratio(10.0, 200.0, lower_is_better=True) == 20.0
    assert ratio(None, 1.0, False) is None and ratio(0.0, 5.0, True) is None


def test_rounds_give_medians_spreads_and_overlap_marks():
    def with_rounds(policy: str, hits: list[float]) -> dict:
        r = result(policy)
        r["rounds"] = [{"summary": {**r["summary"], "token_hit_rate": h}, "cost": r["cost"]} for h in hits]
        return r

    md = markdown({"flashstate": with_rounds("flashstate", [0.5, 0.9, 0.7]),
                   "vllm": with_rounds("vllm", [0.3, 0.4, 0.2])}, "vllm", "rounds")  # fmt: skip
    assert "Each server ran 3 times" in md
    assert "| token hit rate | 70.0% | 30.0% |" in md  # medians
    assert "| token hit rate | 50.0% – 90.0% | 20.0% – 40.0% |" in md  # spreads
    assert "| token hit rate | 2.33× |" in md  # ranges apart: a difference, not noise
    md = markdown({"flashstate": with_rounds("flashstate", [0.35, 0.5]),
                   "vllm": with_rounds("vllm", [0.3, 0.4])}, "vllm", "rounds")  # fmt: skip
    assert "| token hit rate | 1.21× *within spread* |" in md
