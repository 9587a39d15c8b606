"""Prompt splicing through real servers (server/prompt_splice.py): a two-turn chat whose first reply's text
re-tokenizes differently from the ids the model generated. The second turn re-sends that reply as the
assistant message; with splicing its prompt holds the generated ids, so its cached tokens reach the
previous turn's frontier (prompt + output - 1); with `--chat-splice-bytes 0` the prompt leaves the cached
path inside the reply and caches less. /tokenize on the same messages gives the ids the engine saw."""

from __future__ import annotations

import json

import pytest

from flashstate.default_tokenizer import IM_START_ID
from flashstate.server.prompt_splice import ENTRY_OVERHEAD, GeneratedIds
from flashstate.server.protocol import ChatCompletionRequest
from flashstate.server.serving_chat import render_chat
from flashstate.tokenizer import Tokenizer
from tests.server.conftest import running_servers

ARGS = ["--max-model-len", "2k", "--prefill-cost-coefficients", "1e-5", "1e-10"]
SERVERS = {"on": [], "off": ["--chat-splice-bytes", "0"]}
OUT = 16
FIRST = [{"role": "user", "content": "Tell me about topic number 0 in detail."}]


def chat(server, messages: list[dict], **kw) -> dict:
    body = {"messages": messages, "max_tokens": OUT, "temperature": 0.0, "ignore_eos": True, **kw}
    status, reply = server.post_json("/v1/chat/completions", body)
    assert status == 200, reply
    return reply


def tokenize(server, **body) -> list[int]:
    status, reply = server.post_json("/tokenize", body)
    assert status == 200, reply
    return reply["tokens"]


def two_turns(server, stream: bool) -> dict:
    """The first turn, the ids it generated, and the second turn's usage and /tokenize ids."""
    prompt = tokenize(server, messages=FIRST)
    if stream:  # the streamed path remembers the reply too
        status, raw = server.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(
                {"messages": FIRST, "max_tokens": OUT, "temperature": 0.0, "ignore_eos": True, "stream": True}
            ).encode(),
            {"Content-Type": "application/json"},
        )
        assert status == 200
        chunks = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    else:
        text = chat(server, FIRST)["choices"][0]["message"]["content"]
    # The ids of that reply: the same greedy generation from the same prompt ids.
    status, completion = server.post_json(
        "/v1/completions",
        {
            "prompt": prompt,
            "max_tokens": OUT,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200, completion
    assert completion["choices"][0]["text"] == text
    generated = completion["choices"][0]["token_ids"]
    second = [*FIRST, {"role": "assistant", "content": text}, {"role": "user", "content": "And more?"}]
    usage = chat(server, second)["usage"]
    return {
        "prompt": prompt,
        "text": text,
        "generated": generated,
        "usage": usage,
        "tokenized": tokenize(server, messages=second),
        "plain_text": tokenize(server, prompt=text, add_special_tokens=False),
    }


@pytest.fixture(scope="module")
def turns(module_tmp) -> dict[str, dict]:
    out = {}
    with running_servers(module_tmp, {name: ARGS + args for name, args in SERVERS.items()}) as servers:
        for name, server in servers.items():
            out[name] = two_turns(server, stream=False)
            out[name + "-stream"] = two_turns(server, stream=True)
    return out


def test_the_reply_re_tokenizes_differently(turns):
    t = turns["on"]
    assert len(t["generated"]) == OUT
    assert t["plain_text"] != t["generated"]  # the case splicing exists for


@pytest.mark.parametrize("name", ["on", "on-stream"])
def test_splicing_keeps_the_second_turn_on_the_cached_path(turns, name):
    t = turns[name]
    frontier = len(t["prompt"]) + len(t["generated"]) - 1
    assert t["usage"]["prompt_tokens_details"]["cached_tokens"] >= frontier
    # /tokenize gives what the engine saw: the first prompt, then the generated ids, then the rest.
    assert len(t["tokenized"]) == t["usage"]["prompt_tokens"]
    assert t["tokenized"][: frontier + 1] == t["prompt"] + t["generated"]


HIDDEN_OUT = 24


@pytest.fixture(scope="module")
def hidden_special(module_tmp) -> dict:
    """A reply that holds a special token its text does not show (sampled from a few ids and
    <|im_start|>, which `skip_special_tokens` drops, as a random-weight model or `ignore_eos` gives),
    then the second turn re-sending that text."""
    with running_servers(module_tmp, {"hidden": ARGS}) as servers:
        server = servers["hidden"]
        allowed = [*range(300, 304), IM_START_ID]
        sampled = {"temperature": 1.0, "seed": 7, "allowed_token_ids": allowed, "return_token_ids": True}
        reply = chat(server, FIRST, max_tokens=HIDDEN_OUT, **sampled)
        choice = reply["choices"][0]
        text, generated = choice["message"]["content"], choice["token_ids"]
        second = [*FIRST, {"role": "assistant", "content": text}, {"role": "user", "content": "And more?"}]
        return {
            "prompt_tokens": reply["usage"]["prompt_tokens"],
            "text": text,
            "generated": generated,
            "usage": chat(server, second)["usage"],
            "tokenized": tokenize(server, messages=second),
            "prompt": tokenize(server, messages=FIRST),
        }


def test_a_reply_with_hidden_special_tokens_is_spliced(hidden_special):
    t = hidden_special
    assert len(t["generated"]) == HIDDEN_OUT and IM_START_ID in t["generated"]
    assert "<|im_start|>" not in t["text"]  # skipped in the reply's text
    frontier = t["prompt_tokens"] + HIDDEN_OUT - 1
    assert t["usage"]["prompt_tokens_details"]["cached_tokens"] >= frontier
    assert t["tokenized"][: frontier + 1] == t["prompt"] + t["generated"]


def test_without_splicing_the_second_turn_caches_less(turns):
    t = turns["off"]
    frontier = len(t["prompt"]) + len(t["generated"]) - 1
    cached = t["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached < frontier
    assert cached < turns["on"]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert t["tokenized"][: frontier + 1] != t["prompt"] + t["generated"]
    assert len(t["tokenized"]) == t["usage"]["prompt_tokens"]


# ---- the splice itself, with the embedded model's tokenizer and template ------------------------------

CALL_ARGS = '{"input": "ls -la src/flashstate"}'
TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return Tokenizer.from_dir(tiny_model_dir)


def by_char(tokenizer: Tokenizer, text: str) -> list[int]:
    """A non-canonical tokenization of ASCII `text`: one token per character."""
    ids = [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]
    assert len(ids) == len(text) and ids != tokenizer.encode(text, add_special_tokens=False)
    return ids


def call_messages(content: str = "") -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": CALL_ARGS}}
    return [
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": content or None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"},
    ]


def test_tool_call_arguments_are_spliced_and_the_text_is_the_plain_rendering(tokenizer):
    head = tokenizer.encode('<tool_call>\n{"name": "Bash", "arguments": ', add_special_tokens=False)
    args = by_char(tokenizer, CALL_ARGS)
    generated = head + args + tokenizer.encode("}\n</tool_call>", add_special_tokens=False)
    memory = GeneratedIds(1 << 20)
    assert memory.remember_output(tokenizer, None, generated, [CALL_ARGS]) == 1
    req = ChatCompletionRequest.model_validate({"messages": call_messages(), "tools": TOOLS})
    plain_ids, plain_positions = render_chat(tokenizer, req)
    ids, positions = render_chat(tokenizer, req, memory)
    text = tokenizer.apply_chat_template(req_messages(req), req.template_tools())
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert ids != plain_ids and any(ids[k : k + len(args)] == args for k in range(len(ids)))
    # Message ends: as many, each the same text prefix as in the plain tokenization.
    assert len(positions) == len(plain_positions)
    for p, q in zip(positions, plain_positions, strict=True):
        assert tokenizer.decode(ids[:p], False) == tokenizer.decode(plain_ids[:q], False)
    # Another scope (tenant, cache salt) does not see it.
    assert render_chat(tokenizer, req, memory, scope="tenant-b")[0] == plain_ids


def test_content_the_template_changes_is_not_spliced(tokenizer):
    """A template that trims the content would put the marker's text back untrimmed: fall back."""
    content = "  spaced reply  "
    memory = GeneratedIds(1 << 20)
    assert memory.remember_output(tokenizer, None, by_char(tokenizer, content), [content]) == 1
    trimming = tokenizer.with_chat_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]
    req = ChatCompletionRequest.model_validate({"messages": messages})
    assert render_chat(trimming, req, memory) == render_chat(trimming, req)
    # The default template prints it as it is: spliced.
    ids, _ = render_chat(tokenizer, req, memory)
    assert ids != render_chat(tokenizer, req)[0]
    assert tokenizer.decode(ids, False) == tokenizer.apply_chat_template(messages)


def test_a_span_keeps_the_special_tokens_its_text_skips(tokenizer):
    piece = tokenizer.encode(" reply", add_special_tokens=False)
    generated = [*piece, IM_START_ID, *piece]
    text = tokenizer.decode(generated)  # skips <|im_start|>
    assert text == " reply reply"
    memory = GeneratedIds(1 << 20)
    assert memory.remember_output(tokenizer, None, generated, [text]) == 1
    assert memory.get(None, text) == generated
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": text}]
    req = ChatCompletionRequest.model_validate({"messages": messages})
    ids, _ = render_chat(tokenizer, req, memory)
    at = next(k for k in range(len(ids)) if ids[k : k + len(generated)] == generated)
    # the prompt's text is the plain rendering, once the hidden token is left out
    hidden = at + generated.index(IM_START_ID)
    plain = tokenizer.apply_chat_template(messages)
    assert tokenizer.decode(ids[:hidden] + ids[hidden + 1 :], False) == plain


def test_only_texts_on_token_boundaries_are_remembered(tokenizer):
    generated = tokenizer.encode(" evaluation results", add_special_tokens=False)
    full = tokenizer.decode(generated)
    memory = GeneratedIds(1 << 20)
    inside = full[2:-2]  # starts and ends inside tokens
    assert memory.remember_output(tokenizer, None, generated, [full, inside]) == 1
    assert memory.get(None, full) == generated and memory.get(None, inside) is None


def test_the_map_is_bounded_by_bytes_least_recently_used_first():
    memory = GeneratedIds(3 * (4 * 10 + ENTRY_OVERHEAD))
    for k in range(3):
        memory.put(None, f"text {k}", list(range(10)))
    assert memory.get(None, "text 0") is not None  # now the most recently used
    memory.put(None, "text 3", list(range(10)))
    assert len(memory) == 3 and memory.bytes <= memory.capacity
    assert memory.get(None, "text 1") is None and memory.get(None, "text 0") is not None
    memory.put(None, "huge", list(range(10_000)))  # larger than the whole map: not kept
    assert memory.get(None, "huge") is None and len(memory) == 3


def req_messages(req: ChatCompletionRequest) -> list[dict]:
    return [m.to_template() for m in req.messages]
