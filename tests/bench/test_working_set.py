"""The agents' working set of a trace set (`flashstate working-set`) and the fixed tune/validate
split of a trace set (`--trace-split`)."""

import json

import pytest
import torch

from flashstate.bench.workloads import WorkloadError, load_workload
from flashstate.cache.cache_tensors import kv_bytes_per_block, state_bytes_per_slot
from flashstate.cli import main
from flashstate.sim.working_set import session_peak, working_set
from flashstate.spec.hf_config import spec_of

from .test_workloads import agentx_doc


def write_sessions(tmp_path, names):
    for name in names:
        (tmp_path / f"{name}.json").write_text(json.dumps(agentx_doc() | {"id": name}))
    return tmp_path


def test_the_split_is_a_fixed_rule_over_file_names(tmp_path, capsys):
    path = write_sessions(tmp_path, ["d", "b", "a", "c", "e"])
    assert [s.id for s in load_workload(path, split="tune")] == ["a", "c", "e"]
    assert [s.id for s in load_workload(path, split="validate")] == ["b", "d"]
    with pytest.raises(WorkloadError, match="trace split"):
        load_workload(path, split="other")
    assert main(["bench", "run", "--workload", "synthetic", "--trace-split", "tune"]) == 2
    assert "synthetic workload has none" in capsys.readouterr().err


def test_peak_context_at_the_replay_scale(tmp_path):
    (s,) = load_workload(write_sessions(tmp_path, ["s"]))  # top-level turns (in, out): 10+3 20+4 24+1 26+1
    assert session_peak(s, 1.0, None, None) == 27
    assert session_peak(s, 2.0, None, None) == 54
    assert session_peak(s, 1.0, None, 2) == 27  # outputs capped: 12, 22, 25, 27
    assert session_peak(s, 1.0, 24, None) == 24  # the replay ends the session at 24 + 1 > 24


def test_working_set_bytes_and_budgets(tmp_path, capsys):
    path = write_sessions(tmp_path, ["a", "b"])
    spec = spec_of("qwen3-next-2b")
    w = working_set(load_workload(path), 48, spec, torch.bfloat16, max_context=24)
    kv, state = kv_bytes_per_block(spec, 1, torch.bfloat16), state_bytes_per_slot(spec, torch.bfloat16)
    assert w.bytes == 48 * (24 * kv + state) and w.budget(0.5) == w.bytes // 2
    fp8 = working_set(load_workload(path), 48, spec, torch.bfloat16, max_context=24, kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token * 2 == w.kv_bytes_per_token
    assert main(["working-set", str(path), "--model", "qwen3-next-2b", "--max-context", "24",
                 "--fractions", "0.25", "1", "--trace-split", "tune"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["sessions"] == 1 and doc["working_set_bytes"] == w.bytes
    assert doc["budgets"] == {"0.25": w.budget(0.25), "1": w.bytes}


def test_a_missing_trace_set_is_a_one_line_error(tmp_path, capsys):
    assert main(["working-set", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip().startswith("flashstate working-set: error:")
