"""The vLLM API surface end to end on real servers with the openai SDK: n > 1, top logprobs, penalties,
logit_bias, echo, priority, /tokenize, /detokenize, /v1/models/{id}, CORS, --generation-config defaults,
and every vLLM request field either served or refused with a 400 naming it."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from flashstate.models.presets import default_model_dir
from flashstate.server.protocol import (
    CHAT_UNSERVED,
    COMPLETION_UNSERVED,
    ChatCompletionRequest,
    CompletionRequest,
)
from tests.server.conftest import assert_error, running_server

COST = ["--prefill-cost-coefficients", "1e-5", "1e-10"]  # no calibration at start-up
NAME = "flashstate-tiny"
CHAT = [{"role": "user", "content": "hello there"}]
GEN_MAX = 7  # the generation_config.json's max_new_tokens

# Every field of vLLM's CompletionRequest / ChatCompletionRequest (vllm/entrypoints/openai/{completion,
# chat_completion}/protocol.py), plus fields of earlier vLLM versions.
VLLM_COMMON = [
    "model", "frequency_penalty", "logit_bias", "max_tokens", "n", "presence_penalty", "seed", "stop",
    "stream", "stream_options", "temperature", "top_p", "user", "use_beam_search", "top_k", "min_p",
    "repetition_penalty", "watermarking", "length_penalty", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "truncation_side", "allowed_token_ids", "prompt_logprobs",
    "logprob_token_ids", "bad_words", "add_special_tokens", "response_format", "structured_outputs",
    "priority", "request_id", "session_id", "return_tokens_as_token_ids", "return_token_ids",
    "routed_experts_prompt_start", "cache_salt", "kv_transfer_params", "ec_transfer_params", "vllm_xargs",
    "repetition_detection", "thinking_token_budget", "stream_interval", "logprobs", "echo",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
    "guided_whitespace_pattern", "structural_tag", "logits_processors",
]  # fmt: skip
VLLM_COMPLETION = [*VLLM_COMMON, "prompt", "suffix", "best_of", "prompt_embeds"]
VLLM_CHAT = [
    *VLLM_COMMON, "messages", "top_logprobs", "max_completion_tokens", "tools", "tool_choice",
    "reasoning_effort", "include_reasoning", "parallel_tool_calls", "continue_final_message", "documents",
    "chat_template", "chat_template_kwargs", "media_io_kwargs", "mm_processor_kwargs",
    "add_generation_prompt", "return_prompt_text",
]  # fmt: skip
# vLLM ignores these (its docs say so, or they are render-endpoint only): served by ignoring them.
VLLM_IGNORED = {"user", "return_token_offsets", "return_mm_kwargs"}
# A value other than the default, for each field that may be refused.
NON_DEFAULT = {
    "use_beam_search": True, "watermarking": True, "length_penalty": 0.5,
    "spaces_between_special_tokens": False, "truncate_prompt_tokens": 5, "truncation_side": "left",
    "prompt_logprobs": 1, "logprob_token_ids": [1], "bad_words": ["x"], "request_id": "abc",
    "session_id": "s", "return_tokens_as_token_ids": True, "routed_experts_prompt_start": 1,
    "kv_transfer_params": {}, "ec_transfer_params": {}, "vllm_xargs": {}, "repetition_detection": {},
    "thinking_token_budget": 5, "stream_interval": 2, "logits_processors": ["x"],
    "guided_whitespace_pattern": " ", "structural_tag": "x", "echo": True, "continue_final_message": True,
    "chat_template": "x",
    "documents": [], "media_io_kwargs": {}, "mm_processor_kwargs": {}, "return_prompt_text": True,
    "prompt_embeds": "x",
}  # fmt: skip


@pytest.fixture(scope="module")
def server(module_tmp):
    args = ["--scheduling-policy", "priority", *COST]
    (module_tmp / "main").mkdir()
    with running_server(module_tmp / "main", args) as s:
        yield s


@pytest.fixture(scope="module")
def gen_server(module_tmp):
    """A model directory with a generation_config.json (greedy, at most GEN_MAX tokens); fcfs."""
    model = module_tmp / "model"
    model.mkdir()
    for f in Path(default_model_dir()).iterdir():
        (model / f.name).symlink_to(f)
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": GEN_MAX}))
    (module_tmp / "gen").mkdir()
    with running_server(module_tmp / "gen", ["--model", str(model), "--served-model-name", NAME, *COST]) as s:
        yield s


def test_n_choices_each_equal_their_seed_alone(server):
    client = server.client()
    kw = {"model": NAME, "prompt": "the quick brown fox", "max_tokens": 6, "temperature": 1.0}
    both = client.completions.create(n=2, seed=7, **kw)
    assert [c.index for c in both.choices] == [0, 1]
    for i, choice in enumerate(both.choices):
        assert choice.text == client.completions.create(seed=7 + i, **kw).choices[0].text
    assert both.usage.prompt_tokens == client.completions.create(seed=7, **kw).usage.prompt_tokens
    chat = client.chat.completions.create(model=NAME, messages=CHAT, n=2, max_tokens=4, temperature=0)
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy: the same
    stream = client.chat.completions.create(
        model=NAME, messages=CHAT, n=2, max_tokens=4, temperature=1.0, seed=1, stream=True
    )
    texts = {0: "", 1: ""}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    alone = [
        client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=4, temperature=1.0, seed=1 + i)
        for i in range(2)
    ]
    assert [texts[0], texts[1]] == [a.choices[0].message.content for a in alone]


def test_best_of_other_than_n_is_refused(server):
    status, body = server.post_json("/v1/completions", {"prompt": "x", "n": 1, "best_of": 2})
    assert assert_error(status, body, 400)["param"] == "best_of"


def test_top_logprobs(server):
    client = server.client()
    out = client.chat.completions.create(
        model=NAME, messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=5
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert entry.top_logprobs[0].token == entry.token  # greedy, no penalties: the best token
        assert entry.logprob == pytest.approx(values[0])
    comp = client.completions.create(model=NAME, prompt="abc", max_tokens=3, temperature=0, logprobs=3)
    assert all(3 <= len(d) <= 4 for d in comp.choices[0].logprobs.top_logprobs)
    status, body = server.post_json(
        "/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21}
    )
    assert assert_error(status, body, 400)["param"] == "top_logprobs"


def test_penalties_and_logit_bias(server):
    client = server.client()
    out = client.completions.create(
        model=NAME,
        prompt="abc",
        max_tokens=5,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={"42": 100},
        extra_body={"repetition_penalty": 1.2, "return_token_ids": True, "min_tokens": 2},
    )
    assert out.choices[0].token_ids == [42] * 5
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="abc", max_tokens=2, logit_bias={"999999": 1})
    assert e.value.body["param"] == "logit_bias"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="abc", max_tokens=2, logit_bias={"x": 1})
    assert e.value.body["param"] == "logit_bias"


def test_echo(server):
    client = server.client()
    out = client.completions.create(model=NAME, prompt="say it again", max_tokens=3, temperature=0, echo=True)
    plain = client.completions.create(model=NAME, prompt="say it again", max_tokens=3, temperature=0)
    assert out.choices[0].text == "say it again" + plain.choices[0].text
    chunks = list(
        client.completions.create(
            model=NAME, prompt="say it again", max_tokens=3, temperature=0, echo=True, stream=True
        )
    )
    assert chunks[0].choices[0].text == "say it again"
    assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text


def test_priority(server, gen_server):
    out = server.client().completions.create(model=NAME, prompt="x", max_tokens=2, extra_body={"priority": 3})
    assert out.choices[0].finish_reason == "length"
    status, body = gen_server.post_json("/v1/completions", {"prompt": "x", "priority": 3})
    assert assert_error(status, body, 400)["param"] == "priority"


def test_tokenize_and_detokenize(server):
    status, tok = server.post_json("/tokenize", {"prompt": "hello world", "return_token_strs": True})
    assert status == 200 and tok["count"] == len(tok["tokens"]) > 0 and len(tok["token_strs"]) == tok["count"]
    assert tok["max_model_len"] > 0
    status, detok = server.post_json("/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and detok["prompt"].endswith("hello world")
    status, chat = server.post_json("/tokenize", {"messages": CHAT})
    usage = server.client().chat.completions.create(model=NAME, messages=CHAT, max_tokens=1).usage
    assert status == 200 and chat["count"] == usage.prompt_tokens
    status, body = server.post_json("/detokenize", {"tokens": [10**7]})
    assert assert_error(status, body, 400)["param"] == "tokens"
    status, body = server.post_json("/tokenize", {"model": NAME})
    assert_error(status, body, 400)


def test_model_card(server):
    assert server.client().models.retrieve(NAME).id == NAME
    status, raw = server.request("GET", "/v1/models/gpt-4")
    assert_error(status, json.loads(raw), 404, "model_not_found")


def test_cors(server):
    status, _ = server.request(
        "OPTIONS",
        "/v1/chat/completions",
        headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST"},
    )
    assert status == 200
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/v1/models", headers={"Origin": "http://example.com"})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    assert resp.getheader("access-control-allow-origin") == "*"


def test_dev_endpoints_need_the_flag(gen_server):
    status, _ = gen_server.request("POST", "/reset_prefix_cache")
    assert status == 404


def test_generation_config_defaults(gen_server):
    client = gen_server.client()
    a = client.chat.completions.create(model=NAME, messages=CHAT, seed=1)
    b = client.chat.completions.create(model=NAME, messages=CHAT, seed=2)
    assert a.usage.completion_tokens == GEN_MAX  # max_new_tokens: the default max_tokens
    assert a.choices[0].message.content == b.choices[0].message.content  # temperature 0: greedy
    capped = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=GEN_MAX + 5)
    assert capped.usage.completion_tokens == GEN_MAX  # and a cap, as vLLM's
    sampled = {
        client.chat.completions.create(model=NAME, messages=CHAT, temperature=1.0, seed=s)
        .choices[0]
        .message.content
        for s in range(4)
    }
    assert len(sampled) > 1  # a request's own temperature wins


@pytest.mark.parametrize(
    ("path", "model", "known", "unserved"),
    [
        ("/v1/completions", CompletionRequest, VLLM_COMPLETION, COMPLETION_UNSERVED),
        ("/v1/chat/completions", ChatCompletionRequest, VLLM_CHAT, CHAT_UNSERVED),
    ],
)
def test_every_vllm_field_is_served_or_refused_by_name(server, path, model, known, unserved):
    assert not [
        f for f in known if f not in model.model_fields and f not in unserved and f not in VLLM_IGNORED
    ]
    base = {"prompt": "x"} if model is CompletionRequest else {"messages": CHAT}
    base["max_tokens"] = 2
    refused = [f for f in unserved if f not in model.model_fields]
    assert refused
    for field in refused:
        value = NON_DEFAULT.get(
            field, not unserved[field][0] if isinstance(unserved[field][0], bool) else None
        )
        status, body = server.post_json(path, {**base, field: value})
        err = assert_error(status, body, 400)
        assert err["param"] == field, field
        status, body = server.post_json(path, {**base, field: unserved[field][0]})  # its default: fine
        assert status == 200, (field, body)


def test_fields_openai_clients_send_are_accepted(server):
    extra = {
        "user": "u",
        "metadata": {"a": "b"},
        "store": False,
        "service_tier": "auto",
        "prompt_cache_key": "k",
    }
    status, body = server.post_json("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, **extra})
    assert status == 200, body
