"""A request's time outside the engine (HTTP, the prompt's JSON, the server's event loop): the profile's
`request` overhead delays its arrival at the simulated engine (a chat prompt's per-token part shared with the
chat prompts its server prepares at once), and `fit-profile --results` fits it from a run's client records
paired with its server's request lines."""

import gzip
import json
import random
from pathlib import Path

import pytest

from flashstate.cli import main
from flashstate.sim.events import EventLoop
from flashstate.sim.fit import fit_request_overhead
from flashstate.sim.profile import PROFILES_DIR, load_profile
from flashstate.sim.shared_cpu import SharedCPU

from .helpers import growing, run


def _profile_with_overhead(tmp_path, base_s: float, per_token_s: float) -> str:
    doc = json.loads((PROFILES_DIR / "h200-qwen3-next-2b-served.json").read_text())
    doc["request"] = {"overhead_s": base_s, "overhead_per_token_s": per_token_s}
    path = tmp_path / "with-overhead.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_lone_requests_ttft_grows_by_the_profiles_overhead(tmp_path):
    path = _profile_with_overhead(tmp_path, 0.02, 1e-6)
    assert load_profile(path).request_overhead(1000) == pytest.approx(0.021)
    session = [growing("s", 1, first=1000, step=0)]
    flags = ["--kv-cache-memory-bytes", "4G"]
    plain, _ = run(session, "flashstate", flags, profile="h200-qwen3-next-2b-served")
    slow, _ = run(session, "flashstate", flags, profile=path)
    (a,), (b,) = plain.requests, slow.requests
    assert b.prompt_tokens == a.prompt_tokens == 1000
    assert b.ttft - a.ttft == pytest.approx(0.02 + 1e-6 * 1000)
    assert b.e2e - a.e2e == pytest.approx(0.02 + 1e-6 * 1000)


def test_chat_prompts_sent_together_share_their_servers_cpu(tmp_path):
    # Two agents send the same chat prompt at once: the fixed part delays each alone, the per-token part
    # (template and splice, under the server's interpreter lock) is prepared side by side, each at half
    # speed, so both reach the engine after twice their own work; token-mode prompts are not shared.
    path = _profile_with_overhead(tmp_path, 0.02, 1e-5)
    sessions = [growing("a", 1, first=1000, step=0), growing("b", 1, first=1000, step=0)]
    flags = ["--kv-cache-memory-bytes", "4G"]
    served = "h200-qwen3-next-2b-served"
    for mode, share in (("chat", 2), ("completions", 1)):
        plain, _ = run(sessions, "flashstate", flags, profile=served, agents=2, mode=mode)
        slow, _ = run(sessions, "flashstate", flags, profile=path, agents=2, mode=mode)
        assert [r.t_send for r in slow.requests] == [0.0, 0.0]
        (n,) = {r.prompt_tokens for r in slow.requests}
        before = sorted(r.ttft for r in plain.requests)
        after = sorted(r.ttft for r in slow.requests)
        assert after == pytest.approx([t + 0.02 + share * 1e-5 * n for t in before]), mode


def test_shared_cpu_gives_each_unfinished_item_an_equal_share():
    loop = EventLoop()
    cpu = SharedCPU(loop)
    done: dict[str, float] = {}

    def submit(name: str, work: float) -> None:
        cpu.submit(work, lambda: done.setdefault(name, loop.now))

    submit("short", 1.0)
    submit("long", 3.0)
    loop.at(0.5, lambda: submit("late", 1.0))
    loop.at(10.0, lambda: submit("alone", 1.0))
    loop.at(20.0, lambda: submit("none", 0.0))  # no work: done at once
    loop.run(lambda: None)
    # 0-0.5 s: two at 1/2 (0.25 each done); then three at 1/3: short's 0.75 left ends at 2.75 s, when late
    # and long have 0.25 and 2.0 left; two at 1/2: late ends at 3.25 s; long's 1.75 left alone: 5.0 s
    assert done == pytest.approx({"short": 2.75, "late": 3.25, "long": 5.0, "alone": 11.0, "none": 20.0})
    assert cpu.busy == 0


def test_the_fit_recovers_the_overhead_from_paired_records():
    rng = random.Random(0)
    server, client = [], []
    for i in range(200):
        prompt, cached = 1000 + 97 * i, 13 * i  # unique pairs on both sides
        engine_ttft = rng.uniform(0.01, 0.5)
        extra = 0.015 + 2e-7 * prompt + rng.uniform(-1e-4, 1e-4)
        if i % 50 == 0:
            extra += 3.0  # a stall, left out of the fit
        server.append({"prompt_tokens": prompt, "cached_tokens": cached, "arrival": 5.0,
                       "first_token": 5.0 + engine_ttft})  # fmt: skip
        client.append({"prompt_tokens": prompt, "cached_tokens": cached, "ttft": engine_ttft + extra,
                       "error": None})  # fmt: skip
    client.append(dict(client[0]))  # a duplicate pair: ambiguous, both left out
    fit = fit_request_overhead(server, client)
    assert fit["pairs"] == 199
    assert fit["overhead_s"] == pytest.approx(0.015, abs=5e-4)
    assert fit["overhead_per_token_s"] == pytest.approx(2e-7, rel=0.05)
    with pytest.raises(ValueError, match="pair up"):
        fit_request_overhead(server[:5], client[:5])


def test_a_chat_replay_takes_the_profiles_chat_overhead(tmp_path):
    # Chat prompts are rendered and tokenized by the server: the profile's chat terms apply to a chat-mode
    # replay, the token-mode terms to the other; a profile with only one chat term is refused.
    doc = json.loads((PROFILES_DIR / "h200-qwen3-next-2b-served.json").read_text())
    doc["request"] = {"overhead_s": 0.01, "overhead_per_token_s": 0.0, "chat_overhead_s": 0.05,
                      "chat_overhead_per_token_s": 2e-6}  # fmt: skip
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(doc))
    profile = load_profile(str(path))
    assert profile.request_overhead_for("completions")(1000) == pytest.approx(0.01)
    assert profile.request_overhead_for("chat")(1000) == pytest.approx(0.052)
    assert load_profile("h200-qwen3-next-2b-served").request_overhead_for("chat")(1000) == 0.0
    del doc["request"]["chat_overhead_s"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="go together"):
        load_profile(str(path))


def test_fit_profile_writes_a_chat_runs_overhead_to_the_chat_terms(tmp_path, capsys):
    # A recorded chat-mode run on the H200 (no host tier): its fitted overhead goes to the chat terms, the
    # token-mode terms stay the base profile's, and its steps hold no host-tier calls.
    run = Path(__file__).resolve().parents[2] / "benchmarks/results/same-sessions-2026-12-03/chat-none"
    out = tmp_path / "chat-fit.json"
    args = ["fit-profile", str(run / "steps-none.jsonl.gz"), "--results", str(run / "result-none.json")]
    assert main([*args, "--base", "h200-qwen3-next-2b-graphed", "--out", str(out)]) == 0
    capsys.readouterr()
    fitted, base = load_profile(str(out)), load_profile("h200-qwen3-next-2b-graphed")
    assert fitted.request_overhead == base.request_overhead
    chat = fitted.chat_request_overhead
    assert chat is not None and chat != base.chat_request_overhead and 0 < chat(20_000) < 1.0
    assert not fitted.host_calls_in_steps and "chat_mode" in fitted.provenance
    packed = tmp_path / "result-none.json.gz"  # as benchmarks/results keeps a result: the same fit
    packed.write_bytes(gzip.compress((run / "result-none.json").read_bytes()))
    again = tmp_path / "again.json"
    args = ["fit-profile", str(run / "steps-none.jsonl.gz"), "--results", str(packed), "--name", "chat-fit"]
    assert main([*args, "--base", "h200-qwen3-next-2b-graphed", "--out", str(again)]) == 0
    assert json.loads(again.read_text()) == json.loads(out.read_text())
