from __future__ import annotations

import pytest

from flashstate import LLM, SamplingParams
from flashstate.bench.step_summary import read_trace, summarize_steps

TIMES = ("arrival", "admitted", "running", "first_scheduled", "first_token", "finished")


def test_one_line_per_step_accounts_for_every_token(tiny_model_dir, tmp_path):
    path = tmp_path / "steps.jsonl"
    llm = LLM(
        tiny_model_dir,
        enable_prefix_caching=False,
        max_num_batched_tokens=32,
        step_trace=str(path),
        device="cpu",
    )
    prompts = [[(3 * i + j) % 1000 + 10 for i in range(50 + 20 * j)] for j in range(3)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    llm.close()
    rows, requests = read_trace(path)
    # every prompt token is prefilled exactly once, every later token decoded once (the first comes
    # with the prompt's last chunk)
    assert sum(r["prefill_tokens"] for r in rows) == sum(len(p) for p in prompts)
    assert sum(r["decode_seqs"] for r in rows) == 3 * 4
    assert all(r["prefill_tokens"] <= 32 and r["ms"] >= 0 for r in rows)
    assert rows[0]["waiting"] == 2 and rows[-1]["running"] == 0
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    # async scheduling (on by default) launched decode steps ahead; only pure decode steps go ahead
    assert any(r["ahead"] for r in rows)
    assert all(r["prefill_tokens"] == 0 for r in rows if r["ahead"])
    assert not any(r["graphed"] for r in rows)  # no CUDA graphs on the CPU: every step ran eager
    assert not any(r["exports"] for r in rows)  # no prefix cache: no state is checkpointed
    # chunks of one prompt tile its square: Σ (p + n)² − p² over them is its length squared
    assert sum(r["prefill_pairs"] for r in rows) == sum(len(p) ** 2 for p in prompts)
    # decodes of each request at lengths len(p) + 1 .. len(p) + 4
    assert sum(r["decode_context"] for r in rows) == sum(4 * len(p) + 10 for p in prompts)
    # one line per finished request, its times in order; the third prompt waited for the budget (32 tokens
    # a step: the first two prompts' chunks came first)
    assert sorted(r["prompt_tokens"] for r in requests) == [len(p) for p in prompts]
    for r in requests:
        times = [r[k] for k in TIMES]
        assert times == sorted(times) and r["running"] == r["admitted"] and r["fetched"] is None, r
    assert max(r["admitted"] - r["arrival"] for r in requests) > 0
    parts = summarize_steps(path)["ttft_parts"]
    assert parts["requests"] == 3 and parts["restoring"]["p90"] == 0
    assert parts["queued"]["p90"] > 0 and parts["to_first_step"]["p50"] > 0


def test_an_unwritable_trace_path_is_a_clear_error(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="step_trace: cannot write"):
        LLM(tiny_model_dir, step_trace=str(tmp_path / "missing" / "steps.jsonl"), device="cpu")


def test_with_a_host_tier_rows_carry_its_engine_time_and_restores(tiny_model_dir, tmp_path):
    path = tmp_path / "steps.jsonl"
    llm = LLM(
        tiny_model_dir,
        block_size=4,
        max_num_batched_tokens=256,
        kv_cache_memory_bytes=512 << 20,
        host_cache_bytes=64 << 20,
        step_trace=str(path),
        device="cpu",
    )
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompt = [(7 * i) % 1000 + 10 for i in range(300)]
    out = llm.generate([prompt], params)[0]
    llm.engine.host.flush()
    llm.engine.reset_prefix_cache()  # the next turn's state is on the host only
    llm.generate([prompt + out.token_ids + [5, 6, 7]], params)
    stats = llm.engine.host.stats
    llm.close()
    rows, requests = read_trace(path)
    assert stats.restores == 1 and sum(r["host_restores"] for r in rows) == 1
    # every lookup, write-back and restore ran inside some step: the rows add up to the tier's total
    assert stats.engine_seconds > 0
    assert sum(r["host_ms"] for r in rows) == pytest.approx(1e3 * stats.engine_seconds, abs=0.01 * len(rows))
    assert all(r["host_ms"] >= 0 for r in rows)
    # the second request was restored from the host: it ran only after its restore landed
    first, second = requests
    assert second["running"] >= second["fetched"] >= second["admitted"] >= second["arrival"]
    assert first["running"] == first["admitted"] and first["fetched"] is None
    assert second["cached_tokens"] > 0 and second["prompt_tokens"] == len(prompt) + len(out.token_ids) + 3


def test_rows_count_the_states_a_step_checkpoints(tiny_model_dir, tmp_path):
    # With the prefix cache a prompt's state is exported where it ends (its frontier), inside the step that
    # prefills its last chunk; decode steps export nothing.
    path = tmp_path / "steps.jsonl"
    llm = LLM(tiny_model_dir, max_num_batched_tokens=64, step_trace=str(path), device="cpu")
    prompt = [(7 * i) % 1000 + 10 for i in range(200)]
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    llm.close()
    rows, _ = read_trace(path)
    assert sum(r["exports"] for r in rows) >= 1
    assert all(r["exports"] == 0 for r in rows if r["prefill_tokens"] == 0)
