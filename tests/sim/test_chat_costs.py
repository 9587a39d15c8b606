"""Chat mode beyond its tokens (the profile's "chat" section): the server's template adds tokens to each
message, the same ones when a later turn re-sends the message, rendering a chat prompt takes the engine
thread's time, which the next step waits out, and so does admitting it, on the step that first runs it;
`fit-profile` fits them from chat-mode runs."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from flashstate.cli import main
from flashstate.sim.fit import fit_chat_costs
from flashstate.sim.profile import PROFILES_DIR, ProfileError, load_profile

from .helpers import growing, run

FLAGS = ["--kv-cache-memory-bytes", "4G"]


def _profile(tmp_path, **chat) -> str:
    """The tune profile with `chat` as its chat costs (none given: none)."""
    doc = json.loads((PROFILES_DIR / "h200-qwen3-next-2b-tune.json").read_text())
    doc["chat"] = chat
    path = tmp_path / f"chat-{len(list(tmp_path.glob('chat-*')))}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_chat_prompts_carry_the_templates_tokens_and_later_turns_reuse_them(tmp_path):
    path = _profile(tmp_path, header_tokens=100, per_message_tokens=5, text_share=0.05)
    costs = load_profile(path).chat
    sessions = [growing("s", turns=3, first=2000, step=700, out=40, think=0.5)]
    plain, _ = run(sessions, "flashstate", FLAGS, profile=_profile(tmp_path), mode="chat")
    templated, _ = run(sessions, "flashstate", FLAGS, profile=path, mode="chat")
    first = templated.requests[0]
    assert [r.sent_tokens for r in templated.requests] == [r.prompt_tokens for r in plain.requests]
    assert first.prompt_tokens - first.sent_tokens == costs.template_tokens(first.sent_tokens, True)
    added = [r.prompt_tokens - r.sent_tokens for r in templated.requests]
    assert added[0] < added[1] < added[2]  # each turn's answer and new message bring their own
    # earlier turns' template tokens are re-sent as they were: cached up to the last prompt's last block
    for before, after in zip(templated.requests, templated.requests[1:], strict=False):
        assert after.cached_tokens >= before.prompt_tokens - 64


def test_a_chat_prompts_engine_time_is_waited_out(tmp_path):
    path = _profile(tmp_path, engine_per_token_s=1e-5)
    session = [growing("s", turns=1, first=3000, step=0)]
    (plain,), (slow,) = (run(session, "flashstate", FLAGS, profile=p, mode="chat")[0].requests
                         for p in (_profile(tmp_path), path))  # fmt: skip
    assert slow.ttft - plain.ttft == pytest.approx(1e-5 * 3000)
    token_mode, _ = run(session, "flashstate", FLAGS, profile=path)  # token prompts are not rendered
    assert token_mode.requests[0].ttft < slow.ttft


def test_a_chat_requests_first_step_takes_its_admission_time(tmp_path):
    path = _profile(tmp_path, engine_per_admit_s=0.05)
    session = [growing("s", turns=2, first=3000, step=500)]
    plain, slow = (run(session, "flashstate", FLAGS, profile=p, mode="chat")[0].requests
                   for p in (_profile(tmp_path), path))  # fmt: skip
    for before, after in zip(plain, slow, strict=True):  # each turn's first step; its decodes do not
        assert after.ttft - before.ttft == pytest.approx(0.05)
        assert after.e2e - after.ttft == pytest.approx(before.e2e - before.ttft)
    token_mode, _ = run(session, "flashstate", FLAGS, profile=path)  # only chat admissions cost it
    assert all(t.ttft < c.ttft for t, c in zip(token_mode.requests, slow, strict=True))


def test_the_fit_recovers_the_chat_costs():
    profile = load_profile("h200-qwen3-next-2b-tune")
    client = [
        {"turn": t, "sent_tokens": n, "prompt_tokens": n + 300 + int(0.03 * n) + 2 * 8 * t, "error": None}
        for t in range(6)
        for n in (2000, 9000, 17000, 30000)
    ]
    steps, requests, t = [], [], 0.0
    for i in range(200):  # decode steps back to back; every third one sees a prompt of 1,000·i tokens arrive,
        arriving = 1000 * i if i % 3 == 0 else 0  # every fifth admits one or two requests
        admitted = (1 + i % 2) * (i % 5 == 0)
        seconds = profile.decode(8, 8000) + 4e-7 * arriving + 6e-3 * admitted
        steps.append({"t": t, "ms": 1e3 * seconds, "prefill_tokens": 0, "prefill_pairs": 0, "decode_seqs": 8,
                      "decode_context": 8000, "admitted": admitted})  # fmt: skip
        if arriving:
            requests.append({"arrival": t + seconds / 2, "prompt_tokens": arriving})
        t += seconds
    costs = fit_chat_costs(profile, [(steps, requests)], client)
    assert costs["header_tokens"] == pytest.approx(300, abs=2)
    assert costs["per_message_tokens"] == pytest.approx(8, rel=0.02)
    assert costs["text_share"] == pytest.approx(0.03, rel=0.02)
    assert costs["engine_per_token_s"] == pytest.approx(4e-7, rel=1e-6)
    assert costs["engine_per_admit_s"] == pytest.approx(6e-3, rel=1e-6)


def test_an_unknown_chat_field_is_refused(tmp_path):
    with pytest.raises(ProfileError, match=r"chat: unknown field\(s\) header"):
        load_profile(_profile(tmp_path, header=3))


def test_fit_profile_fits_the_chat_costs_of_a_recorded_chat_run(tmp_path, capsys):
    """`fit-profile --keep-steps` on a card's chat-mode run (2026-12-03, vllm): the base's step model kept,
    the chat section fitted from the run."""
    run = Path(__file__).resolve().parents[2] / "benchmarks/results/same-sessions-2026-12-03/chat-vllm"
    out = tmp_path / "p.json"
    args = ["fit-profile", str(run / "steps-vllm.jsonl.gz"), "--results", str(run / "result-vllm.json")]
    assert main([*args, "--base", "h200-qwen3-next-2b-tune", "--keep-steps", "--out", str(out)]) == 0
    assert "; chat: template" in capsys.readouterr().out
    fitted, base = load_profile(str(out)), load_profile("h200-qwen3-next-2b-tune")
    assert (fitted.prefill.a, fitted.decode, fitted.graphed_step_s) == (
        base.prefill.a,
        base.decode,
        base.graphed_step_s,
    )
    assert 200 < fitted.chat.header_tokens < 450 and 0.01 < fitted.chat.text_share < 0.05
    assert fitted.chat.engine_per_token_s > 0


def test_keep_steps_without_results_is_refused(tmp_path, capsys):
    trace = (
        Path(__file__).resolve().parents[2]
        / "benchmarks/results/same-sessions-2026-12-03/chat-vllm/steps-vllm.jsonl.gz"
    )
    assert main(["fit-profile", str(trace), "--keep-steps", "--out", str(tmp_path / "p.json")]) == 2
    assert "--keep-steps" in capsys.readouterr().err and not (tmp_path / "p.json").exists()


def test_continuations_count_the_tokens_they_get_short_of_the_frontier(tmp_path):
    """As a card run counts them (bench/replay.py): a turn that re-sends its whole context has the previous
    turn's prompt + output − 1 as its frontier. A chat answer whose reasoning is not re-sent leaves the cached
    path at the prompt's end, short of it by about the reasoning; a plain answer reaches it."""
    plain = growing("s", turns=3, first=2000, step=700, out=40, think=0.5)
    thinking = replace(
        plain, requests=tuple(replace(r, output_types=("thinking", "text")) for r in plain.requests)
    )
    kept, _ = run([plain], "flashstate", FLAGS, profile=_profile(tmp_path), mode="chat")
    cut, _ = run([thinking], "flashstate", FLAGS, profile=_profile(tmp_path), mode="chat")
    for result in (kept, cut):
        first, *later = result.requests
        assert first.frontier is None and all(r.frontier is not None for r in later)
        for before, after in zip(result.requests, later, strict=False):
            assert after.frontier == before.prompt_tokens + before.output_tokens - 1
    assert all(r.short_of_frontier == 0 for r in kept.requests)
    assert all(r.short_of_frontier > 0 for r in cut.requests[1:])
