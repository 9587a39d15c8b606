"""Tokenizer: the embedded default, HF directories, chat templates and message boundaries."""

import functools
import hashlib
import json
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import processors

from flashstate.default_tokenizer import (
    DEFAULT_CHAT_TEMPLATE,
    DEFAULT_VOCAB_SIZE,
    ENDOFTEXT_ID,
    IM_END_ID,
    IM_START_ID,
    build_default_tokenizer,
    write_default_tokenizer,
)
from flashstate.tokenizer import BOUNDARY_MESSAGES, ChatTemplateError, Tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix a.py & b.py <now>"},
    {
        "role": "assistant",
        "content": "Reading it.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "print('héllo')"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"name": "read_file", "arguments": {"path": "b.py"}}],
    },
    {"role": "tool", "content": "x = 1"},
    {"role": "user", "content": [{"type": "text", "text": "Thanks, "}, {"type": "text", "text": "go on."}]},
]
EXPECTED = """\
<|im_start|>system
You are a coding agent.

You can call the tools below. Each line is one tool's JSON schema:
{"type": "function", "function": {"name": "read_file", "description": "Read a file", \
"parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
To call tools, write one JSON object per call, each between <tool_call> and </tool_call>:
<tool_call>
{"name": "tool name", "arguments": {"argument": "value"}}
</tool_call><|im_end|>
<|im_start|>user
Fix a.py & b.py <now><|im_end|>
<|im_start|>assistant
Reading it.
<tool_call>
{"name": "read_file", "arguments": {"path": "a.py"}}
</tool_call><|im_end|>
<|im_start|>tool
print('héllo')<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "read_file", "arguments": {"path": "b.py"}}
</tool_call><|im_end|>
<|im_start|>tool
x = 1<|im_end|>
<|im_start|>user
Thanks, go on.<|im_end|>
<|im_start|>assistant
"""


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_dir(write_default_tokenizer(tmp_path_factory.mktemp("tok")))


def _with_template(template: str) -> Tokenizer:
    return Tokenizer(build_default_tokenizer(), template, {"eos_token": "<|im_end|>"})


def test_default_tokenizer_is_deterministic_and_fills_the_vocab():
    a, b = build_default_tokenizer(), build_default_tokenizer()
    assert a.to_str() == b.to_str()
    assert a.get_vocab_size(with_added_tokens=True) == DEFAULT_VOCAB_SIZE
    assert [a.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [
        ENDOFTEXT_ID,
        IM_START_ID,
        IM_END_ID,
    ]
    # Every id decodes to something: no holes between the bytes, the merges and the special tokens.
    assert all(a.id_to_token(i) is not None for i in range(DEFAULT_VOCAB_SIZE))


def test_default_tokenizer_content_is_pinned():
    """Vocabulary and merges are the same on every machine and library version. Changing `_CORPUS` or the
    merge learner changes this digest (and the default model's cache directory): update it deliberately."""
    model = json.loads(build_default_tokenizer().to_str())["model"]
    merges = [m.split(" ") if isinstance(m, str) else list(m) for m in model["merges"]]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(json.dumps([vocab, merges], ensure_ascii=False).encode()).hexdigest()
    assert digest == "45d59304aee3cb2ac66eba33ed71895c96e90e71c601d02f380eb4d554bbac5c"


def test_written_directory_loads(tmp_path, tok):
    assert tok.vocab_size == DEFAULT_VOCAB_SIZE
    assert tok.eos_token_ids == (IM_END_ID,)
    assert tok.chat_template == DEFAULT_CHAT_TEMPLATE
    config = json.loads((write_default_tokenizer(tmp_path) / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain English text, with punctuation!",
        "def f(x: int) -> int:\n\treturn x ** 2  # squared\n\n\n    indented\r\n",
        "naïve café — 日本語のテキスト, Ελληνικά, emoji 🎉👩‍💻, zero\u200bwidth",
        '{"name": "read_file", "arguments": {"path": "src/main.rs"}}',
    ],
)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < DEFAULT_VOCAB_SIZE for i in ids)
    assert tok.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_round_trip_any_text(text):
    tok = _default_backend()
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


@functools.cache
def _default_backend():
    return build_default_tokenizer()


def test_code_compresses(tok):
    text = "def load_config(path):\n    with open(path) as f:\n        return json.load(f)\n"
    assert len(tok.encode(text)) < len(text.encode()) / 2


@pytest.mark.parametrize("special", [True, False])
def test_encode_gives_the_backends_single_text_ids(tok, special):
    for text in ["", "a<|im_start|>user\nhi<|im_end|>b", "def f(x):\n    return x  # ünï\n" * 50]:
        assert (
            tok.encode(text, add_special_tokens=special)
            == tok.backend.encode(text, add_special_tokens=special).ids
        )


def test_encoding_a_long_prompt_lets_other_threads_run(tok):
    """The engine thread steps on the same GIL as the server's tokenizing threads: a long encode must not
    hold it (the single-text backend call does, for its whole duration)."""
    text = " ".join(f"w{i % 997} = f(x, {i})" for i in range(40_000))
    start = time.perf_counter()
    tok.encode(text)
    alone = time.perf_counter() - start
    worker = threading.Thread(target=tok.encode, args=(text,))
    gaps, last = [], time.perf_counter()
    worker.start()
    while worker.is_alive():
        time.sleep(0.001)  # needs the GIL back to return
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    assert alone > 0.05  # long enough for a held GIL to show
    assert max(gaps) < alone / 2


def test_special_tokens_are_atomic(tok):
    ids = tok.encode("a<|im_start|>user\nhi<|im_end|>b", add_special_tokens=False)
    assert IM_START_ID in ids and IM_END_ID in ids
    assert tok.decode(ids) == "auser\nhib"
    assert tok.decode(ids, skip_special_tokens=False) == "a<|im_start|>user\nhi<|im_end|>b"


def test_chat_template_with_tool_calls(tok):
    assert tok.apply_chat_template(CONVERSATION, tools=TOOLS) == EXPECTED


def test_chat_template_without_tools_or_generation_prompt(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    # Tools without a system message get a system message of their own.
    with_tools = tok.apply_chat_template(messages[1:], tools=TOOLS)
    assert with_tools.startswith("<|im_start|>system\nYou can call the tools below.")


def test_boundaries_are_message_ends(tok):
    prompt = tok.apply_chat_template(CONVERSATION, tools=TOOLS)
    ids = tok.encode(prompt, add_special_tokens=False)
    bounds = tok.chat_message_boundaries(CONVERSATION, tools=TOOLS)
    assert bounds == sorted(set(bounds)) and bounds[0] > 0
    assert bounds[-1] == len(ids)
    assert len(bounds) == len(CONVERSATION) + 1  # each message, then the generation prompt
    for k, end in enumerate(bounds[:-1]):
        partial = tok.apply_chat_template(CONVERSATION[: k + 1], tools=TOOLS, add_generation_prompt=False)
        assert tok.decode(ids[:end], skip_special_tokens=False) == partial
    without = tok.chat_message_boundaries(CONVERSATION, tools=TOOLS, add_generation_prompt=False)
    assert without == bounds[:-1]


def test_boundaries_of_a_long_chat_take_a_bounded_number_of_renders(tok, monkeypatch):
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"m{i}"} for i in range(2000)]
    renders = []
    render = tok.apply_chat_template
    monkeypatch.setattr(
        tok, "apply_chat_template", lambda m, *a, **k: renders.append(len(m)) or render(m, *a, **k)
    )
    bounds = tok.chat_message_boundaries(messages)
    assert len(renders) == BOUNDARY_MESSAGES + 1  # the full render, then one per message at the end
    assert len(bounds) == BOUNDARY_MESSAGES + 1
    ids = tok.encode(render(messages), add_special_tokens=False)
    assert bounds[-1] == len(ids)
    first = render(messages[: 2000 - BOUNDARY_MESSAGES + 1], add_generation_prompt=False)
    assert tok.decode(ids[: bounds[0]], skip_special_tokens=False) == first


def test_boundaries_round_down_inside_a_merged_token():
    # The message text ends inside a merged token: "Ġreturn" starts in one message and ends in the next.
    tok = _with_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    messages = [{"role": "user", "content": "x re"}, {"role": "user", "content": "turn y"}]
    ids = tok.encode("x return y", add_special_tokens=False)
    assert tok.backend.encode("x return y").tokens == ["x", "Ġreturn", "Ġy"]
    assert tok.chat_message_boundaries(messages) == [1, len(ids)]


def test_boundaries_ignore_trimmed_offsets():
    # A ByteLevel post-processor with trim_offsets (RoBERTa-style) shrinks whitespace tokens' spans: "ĊĠ"
    # below covers characters [1, 3) but reports [1, 2), which would put it wholly inside "a\n".
    trimmed = build_default_tokenizer()
    trimmed.post_processor = processors.ByteLevel(trim_offsets=True)
    tok = Tokenizer(trimmed, "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert trimmed.encode("a\n  b").tokens == ["a", "ĊĠ", "Ġb"]
    assert trimmed.encode("a\n  b").offsets[1] == (1, 2)
    messages = [{"role": "user", "content": "a\n"}, {"role": "user", "content": "  b"}]
    assert tok.chat_message_boundaries(messages) == [1, 3]


def test_boundaries_fall_back_when_a_template_rewrites_earlier_turns():
    # The last message renders differently from the same message followed by others.
    tok = _with_template(
        "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m.content }}\n{% endfor %}"
    )
    messages = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    full = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    assert tok.chat_message_boundaries(messages) == [len(full)]


def test_boundaries_skip_prefixes_the_template_refuses():
    template = (
        "{% if messages[-1].role != 'user' %}{{ raise_exception('last message must be from the user') }}"
        "{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    )
    tok = _with_template(template)
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    bounds = tok.chat_message_boundaries(messages)
    assert len(bounds) == 2  # after message 0 and at the end: the prefix ending with "assistant" raised
    assert bounds[-1] == len(tok.encode(tok.apply_chat_template(messages), add_special_tokens=False))


def test_template_helpers():
    tok = _with_template(
        "{{ messages[0].content | tojson }} {{ strftime_now('%Y') | length }} {{ eos_token }}"
    )
    assert tok.apply_chat_template([{"role": "user", "content": "<a & 'b'> é"}]) == (
        "\"<a & 'b'> é\" 4 <|im_end|>"
    )
    kw = _with_template("{{ enable_thinking }}")
    assert kw.apply_chat_template([{"role": "user", "content": ""}], enable_thinking=False) == "False"


@pytest.mark.parametrize(
    "messages, match",
    [
        ("hello", "list of dicts"),
        ({"role": "user", "content": "hi"}, "list of dicts"),
        (["hello"], "message 0 must be a dict"),
        ([{"content": "hi"}], "message 0 has no string 'role'"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant"}], "message 1 .* neither 'content'"),
        ([{"role": "user", "content": 42}], "content must be a string or a list"),
    ],
)
def test_malformed_messages(tok, messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        tok.apply_chat_template(messages)


def test_template_errors(tok):
    raising = _with_template("{{ raise_exception('no system messages, please') }}")
    with pytest.raises(ChatTemplateError, match="no system messages, please"):
        raising.apply_chat_template([{"role": "system", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not parse"):
        _with_template("{% for m in messages %}").apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Tokenizer(build_default_tokenizer()).apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="tools must be a list"):
        tok.apply_chat_template([{"role": "user", "content": "x"}], tools="read_file")
    concatenating = _with_template("{{ messages[0].content + '!' }}")
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        concatenating.apply_chat_template([{"role": "assistant", "content": None, "tool_calls": [{}]}])
    sandboxed = _with_template("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        sandboxed.apply_chat_template([{"role": "user", "content": "x"}])


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_template_sources(tmp_path):
    write_default_tokenizer(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    config_path.write_text(json.dumps(config))
    assert Tokenizer.from_dir(tmp_path).chat_template == "D"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "J1"
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END_ID, ENDOFTEXT_ID]}))
    assert Tokenizer.from_dir(tmp_path).eos_token_ids == (IM_END_ID, ENDOFTEXT_ID)


def test_transformers_reads_the_same_directory(tmp_path, tok):
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(str(write_default_tokenizer(tmp_path)))
    assert hf.eos_token_id == IM_END_ID and hf.pad_token_id == ENDOFTEXT_ID
    text = "naïve café 日本 🎉 <|im_end|> def f():\n\treturn 1"
    assert hf.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    rendered = hf.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert rendered == EXPECTED
