import gzip
import json

import pytest

from flashstate.bench.workloads import WorkloadError, load_agentx, load_mooncake, load_workload, trace_format


def agentx_doc() -> dict:
    """A small AgentX session: turn 0, two sub-agents launched after it, turn 1 after they returned."""
    return {
        "id": "s1",
        "block_size": 4,
        "hash_id_scope": "local",
        "system_tokens": 3,
        "tool_tokens": 5,
        "requests": [
            {
                "t": 0.0,
                "type": "n",
                "in": 10,
                "out": 3,
                "hash_ids": [1, 2],
                "think_time": 0.0,
                "api_time": 2.0,
                "stop": "tool_use",
            },
            {
                "t": 7.0,
                "type": "subagent",
                "agent_id": "a1",
                "duration_ms": 4500,
                "requests": [
                    {"t": 0.0, "in": 9, "out": 2, "hash_ids": [50, 51], "think_time": 0.0},
                    {"t": 2.0, "in": 13, "out": 2, "hash_ids": [50, 51, 52], "think_time": 1.0},
                ],
            },
            {
                "t": 9.0,
                "type": "subagent",
                "agent_id": "a2",
                "duration_ms": 6000,
                "requests": [
                    {"t": 0.0, "in": 9, "out": 2, "hash_ids": [50, 51]},
                ],
            },
            {
                "t": 12.5,
                "type": "n",
                "in": 20,
                "out": 4,
                "hash_ids": [1, 2, 3, 4, 5],
                "think_time": 10.5,
                "stop": "end_turn",
            },
            {"t": 40.0, "type": "s", "in": 24, "out": 1, "hash_ids": [1, 2, 3, 4, 5, 6], "api_time": 1.0},
            {"t": 45.0, "type": "s", "in": 26, "out": 1, "hash_ids": [1, 2, 3, 4, 5, 6]},
        ],
    }


def test_agentx_structure_and_subagent_timing(tmp_path):
    path = tmp_path / "s1.json"
    path.write_text(json.dumps(agentx_doc()))
    (s,) = load_agentx(path)
    assert (s.id, s.block_size, s.scope) == ("s1", 4, "s1")
    assert [r.input_len for r in s.requests] == [10, 20, 24, 26]
    assert s.requests[0].hash_ids == (1, 2)
    # Sub-agents listed after turn 0 are launched when it finishes, in the parent's id space.
    subs = s.requests[0].subagents
    assert [a.id for a in subs] == ["s1/a1", "s1/a2"] and all(a.scope == "s1" for a in subs)
    assert [len(a.requests) for a in subs] == [2, 1]
    # a1 returned at 7.0 after 4.5 s: launched at 2.5, 0.5 s after turn 0 ended at 0 + api_time 2.0.
    assert subs[0].requests[0].think_time == pytest.approx(0.5)
    assert subs[1].requests[0].think_time == pytest.approx(1.0)
    # Turn 1 waits only for what remained after the last sub-agent returned (12.5 − 9.0), not 10.5.
    assert s.requests[1].think_time == pytest.approx(3.5)
    # No think_time recorded: the gap after the previous request's response.
    assert s.requests[3].think_time == pytest.approx(45.0 - 40.0 - 1.0)
    assert [(d, x.id) for d, x in s.walk()] == [(0, "s1"), (1, "s1/a1"), (1, "s1/a2")]


def test_agentx_gz_directory_and_list_files(tmp_path):
    with gzip.open(tmp_path / "b.json.gz", "wt") as f:
        json.dump(agentx_doc(), f)
    doc = agentx_doc() | {"hash_id_scope": "global"}
    (tmp_path / "a.json").write_text(json.dumps([doc, {k: v for k, v in doc.items() if k != "id"}]))
    (tmp_path / "notes.txt").write_text("ignored")
    sessions = load_agentx(tmp_path)
    assert [s.id for s in sessions] == ["s1", "a-1", "s1"]
    assert [s.scope for s in sessions] == ["", "", "s1"]
    assert trace_format(tmp_path) == "agentx"
    assert len(load_workload(tmp_path, limit=1)) == 2  # one file, holding two sessions


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["requests"][3].pop("in"), "requests[3].in: missing"),
        (lambda d: d["requests"][0].update(out="many"), "requests[0].out: expected int"),
        (lambda d: d["requests"][0].update(hash_ids=[1, "x"]), "requests[0].hash_ids[1]: expected int"),
        (lambda d: d["requests"][0].update(hash_ids=[1, 2, 3, 4]), "requests[0].hash_ids: 4 blocks of 4"),
        (lambda d: d["requests"][3].update(think_time=-1), "requests[3].think_time: expected a finite"),
        (lambda d: d["requests"][1]["requests"][1].pop("hash_ids"), "requests[1].requests[1].hash_ids"),
        (lambda d: d.update(requests=[]), "requests: expected a non-empty list"),
        (lambda d: d.update(block_size="64"), ".block_size: expected int"),
        (lambda d: d.update(hash_id_scope="galaxy"), ".hash_id_scope: expected 'local' or 'global'"),
    ],
)
def test_agentx_malformed_names_file_and_field(tmp_path, edit, field):
    doc = agentx_doc()
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(WorkloadError) as e:
        load_agentx(path)
    assert str(path) in str(e.value) and field in str(e.value)


def test_agentx_not_json_and_missing_path(tmp_path):
    (tmp_path / "x.json.gz").write_bytes(b"not gzip")
    with pytest.raises(WorkloadError, match=r"x\.json\.gz: not readable JSON"):
        load_agentx(tmp_path)
    with pytest.raises(WorkloadError, match="no such file"):
        load_workload(tmp_path / "nope")


def test_mooncake_sessions_delays_and_aliases(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1], "session_id": "a"},
        {"timestamp": 100, "input_tokens": 100, "output_tokens": 5, "hash_ids": []},
        {"timestamp": 2500, "input_length": 1100, "output_length": 7, "hash_ids": [1, 2], "session_id": "a"},
        {
            "timestamp": 9000,
            "input_length": 1200,
            "output_length": 7,
            "hash_ids": [1, 2],
            "session_id": "a",
            "delay": 1500,
        },
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert trace_format(path) == "mooncake"
    a, single = load_workload(path)
    assert (a.id, a.block_size, a.scope) == ("a", 512, "")
    assert [r.input_len for r in a.requests] == [600, 1100, 1200]
    assert [r.think_time for r in a.requests] == [0.0, 2.5, 1.5]  # timestamp gap, then `delay` (ms)
    assert (single.id, single.requests[0].input_len, single.requests[0].output_len) == ("t.jsonl:2", 100, 5)


def test_mooncake_malformed_names_line_and_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}\n'
        '{"timestamp": 1, "output_length": 1, "hash_ids": []}\n'
    )
    with pytest.raises(WorkloadError, match=r"t\.jsonl: line 2\.input_length: missing"):
        load_mooncake(path)
    path.write_text("{oops\n")
    with pytest.raises(WorkloadError, match="line 1: not JSON"):
        load_mooncake(path)


# --- the real Claude-Code traces (skipped when absent) -------------------------------------------------


def test_real_traces_structure(real_sessions):
    assert len(real_sessions) == 166
    assert sum(len(s.requests) for top in real_sessions for _, s in top.walk()) == 6976
    for top in real_sessions:
        assert top.scope == top.id and top.block_size == 64
        for _, s in top.walk():
            for r in s.requests:
                assert len(r.hash_ids) == r.input_len // 64  # one id per full block
                assert r.think_time >= 0


def test_real_trace_subagent_nesting(traces):
    (s,) = load_agentx(traces / "trace_0277.json.gz")
    groups = [(i, [a.id for a in r.subagents]) for i, r in enumerate(s.requests) if r.subagents]
    assert groups == [
        (0, ["trace_0277/agent_001", "trace_0277/agent_002", "trace_0277/agent_003"]),
        (6, ["trace_0277/agent_004"]),
    ]
    subs = s.requests[0].subagents
    assert [len(a.requests) for a in subs] == [4, 12, 17]
    # Siblings share their own system prompt blocks (same ids in the session's scope), not the parent's.
    assert subs[0].requests[0].hash_ids[:100] == subs[1].requests[0].hash_ids[:100]
    assert subs[0].requests[0].hash_ids[0] not in s.requests[0].hash_ids
    # The parent's next turn: the recorded gap after the last sub-agent returned (228 − 211.347 s).
    assert s.requests[1].think_time == pytest.approx(228.0 - 211.347)
    assert all(0 < a.requests[0].think_time < 1 for a in subs)  # launched right after turn 0
