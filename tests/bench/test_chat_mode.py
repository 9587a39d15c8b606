"""Chat-mode replay (flashstate/bench/chat.py): AgentX sessions as system / tools / user / assistant with
tool calls / tool messages, against a real `flashstate serve` on 127.0.0.1 (embedded tiny model, CPU)."""

import json

import pytest

from flashstate.bench.chat import assistant_turn, first_turn, next_input, render, words
from flashstate.bench.client import Completion
from flashstate.bench.compare import ServerSpec, server_process
from flashstate.bench.config import ReplayConfig
from flashstate.bench.prompts import BlockTokens, Segment
from flashstate.bench.replay import replay
from flashstate.bench.workloads import Request, Session, load_agentx
from flashstate.cli import main

SERVE = (
    "--device cpu --max-num-seqs 4 --max-model-len 8192 --prefill-cost-coefficients 1e-5 1e-10 "
    "--enable-auto-tool-choice --tool-call-parser hermes"
)


def _trace(sid: str, turns: int, base: int) -> dict:
    """An AgentX session: a 64-token system prompt, 64 tokens of tool definitions, then tool loops."""
    reqs, blocks = [], [base + i for i in range(4)]
    for k in range(turns):
        reqs.append(
            {
                "t": float(k),
                "in": 64 * len(blocks) + 10,
                "out": 12,
                "hash_ids": list(blocks),
                "input_types": ["text"] if k in (0, 3) else ["tool_result"],
                "output_types": ["thinking", "text", "tool_use"] if k != 2 else ["text"],
                "stop": "tool_use" if k != 2 else "end_turn",
            }
        )
        blocks.append(base + 100 + k)
    return {"id": sid, "block_size": 64, "system_tokens": 64, "tool_tokens": 64, "requests": reqs}


@pytest.fixture()
def trace_dir(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    for i, turns in enumerate((4, 3)):
        (d / f"s{i}.json").write_text(json.dumps(_trace(f"s{i}", turns, 1000 * (i + 1))))
    return d


def test_words_are_prefix_stable():
    ids = list(range(40, 90))
    for per_word in (1.0, 2.5, 3.0):
        full = words(ids, per_word).split()
        assert 50 / per_word - 1 <= len(full) <= 50 / per_word + 1
        for cut in (7, 23, 49):
            assert full[: len(words(ids[:cut], per_word).split())] == words(ids[:cut], per_word).split()


def test_messages_carry_system_tools_calls_and_results():
    session = Session("s", (), 64, meta={"system_tokens": 10, "tool_tokens": 8})
    context = first_turn(Segment("user", list(range(30))), session, 1.0, tools=True)
    assert [(s.role, len(s.ids)) for s in context] == [("system", 10), ("tools", 8), ("user", 12)]
    req = Request(30, 6, (), output_types=("thinking", "text", "tool_use"), stop="tool_use")
    reply = Completion(t_send=0.0, text="alpha beta gamma delta", completion_tokens=6)
    turn = assistant_turn(reply, req, BlockTokens(64), "s", 0, 0.5, tools=True)
    assert turn.text == "delta" and len(turn.calls) == 1  # reasoning not re-sent, the recorded call attached
    context.append(turn)
    nxt = Request(40, 6, (), input_types=("tool_result",))
    context.append(next_input(context, Segment("user", [5, 6, 7]), nxt))
    messages, tools = render(context)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert [t["function"]["name"] for t in tools] == ["Bash", "Read", "Edit", "Grep"]
    call = messages[2]["tool_calls"][0]
    assert messages[3]["tool_call_id"] == call["id"] and json.loads(call["function"]["arguments"])["input"]
    # the same turn again gives the same call (every policy replays the same messages)
    again = assistant_turn(reply, req, BlockTokens(64), "s", 0, 0.5, tools=True)
    assert again.calls == turn.calls


def test_chat_replay_on_a_real_server(trace_dir, tmp_path):
    sessions = load_agentx(trace_dir)
    assert sessions[0].requests[1].input_types == ("tool_result",)
    with server_process(ServerSpec(tuple(SERVE.split())), "flashstate", tmp_path / "server.log") as (url, _):
        cfg = ReplayConfig(base_url=url, mode="chat", agents=2, duration_s=300, max_sessions=2,
                           time_scale=0.0, max_output_tokens=8, progress=False)  # fmt: skip
        res = replay(cfg, sessions)
    assert len(res.requests) == 7 and all(r.error is None for r in res.requests)
    assert res.config["chat_tokens_per_word"] > 1  # calibrated on the server's /tokenize
    later = [r for r in res.requests if r.turn > 0]
    assert all(r.tool_calls > 0 for r in later)  # assistant turns with tool calls in the history
    assert any(r.tool_results > 0 for r in later)  # and tool messages answering them
    assert all(r.cached_tokens > 0 for r in later)  # each turn resumes the last one's prompt
    # the reasoning is not re-sent: a continuation after a thinking turn gets less than prompt + output
    assert any(r.frontier is not None and r.cached_tokens < r.frontier for r in later)


def test_compare_in_chat_mode_adds_the_tool_parser(trace_dir, tmp_path):
    out = tmp_path / "cmp"
    serve = "--device cpu --max-num-seqs 4 --max-model-len 8192 --prefill-cost-coefficients 1e-5 1e-10"
    rc = main(["bench", "compare", "--mode", "chat", "--policies", "flashstate", "--serve-args", serve,
               "--workload", str(trace_dir), "--agents", "2", "--warmup", "0", "--duration", "300",
               "--max-sessions", "2", "--time-scale", "0", "--max-output-tokens", "8", "--no-progress",
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    r = json.loads((out / "result-flashstate.json").read_text())
    assert "--tool-call-parser" in r["server"]["command"]
    assert r["summary"]["errors"] == 0 and r["summary"]["requests"] == 7
    assert r["summary"]["continuations"] > 0 and r["summary"]["diverged_before_frontier"] > 0
