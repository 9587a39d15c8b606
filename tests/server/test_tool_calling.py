"""Tool calling and reasoning through /v1/chat/completions: the flags, the request plan (chat_tools.py), the
constrained tool choices (tool_choice.py), chat templates fed OpenAI tool-call messages, and the `openai`
SDK in multi-turn tool loops against `flashstate serve` on the embedded model.

The embedded model has random weights: its free text is noise, so the end-to-end calls come from
`tool_choice: "required"` or a named function, where the output is constrained to the tools' schemas and
every call must validate against its tool's parameters."""

from __future__ import annotations

import json
import random
from typing import Any, get_args

import jsonschema
import openai
import pytest

from flashstate.cli import main
from flashstate.config import EngineConfig, ReasoningParserName, ToolCallParser
from flashstate.server.chat_tools import AUTO_NEEDS_FLAGS, ChatParsing, SpecialTextFilter
from flashstate.server.errors import APIError
from flashstate.server.protocol import ChatCompletionRequest
from flashstate.server.reasoning import REASONING_PARSERS
from flashstate.server.serving_chat import render_chat
from flashstate.server.tool_choice import NamedCallParser, RequiredCallsParser, named_schema, required_schema
from flashstate.server.tool_parsers import TOOL_PARSERS, collect
from flashstate.tokenizer import Tokenizer, special_token
from tests.server.conftest import assert_error, running_server

MODEL = "flashstate-tiny"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
UNITS = {
    "type": "object",
    "properties": {"metric": {"type": "boolean"}},
    "required": ["metric"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "set_units", "parameters": UNITS}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "Weather in Paris for three days, in metric units?"}]

# A Qwen3-Coder style template: it concatenates `message.content` (undefined or None would fail), writes
# arguments with `arguments|items`, and marks assistant turns with HF's `{% generation %}` tags.
QWEN_STYLE_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n# Tools\\n' }}
{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == "assistant" %}
{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message.content }}
{%- for tool_call in message.tool_calls or [] %}
{%- set fn = tool_call.function %}
{{- '\\n<tool_call>\\n<function=' + fn.name + '>\\n' }}
{%- for name, value in fn.arguments | items %}
{{- '<parameter=' + name + '>\\n' + (value if value is string else value | tojson) + '\\n</parameter>\\n' }}
{%- endfor %}
{{- '</function>\\n</tool_call>' }}
{%- endfor %}{% endgeneration %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == "tool" %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

CALL_HISTORY = [
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris","days":3}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def request(**kw: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": USER, **kw})


@pytest.fixture(scope="module")
def tok(tiny_model_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


def parsing(tokenizer: Tokenizer, **flags: Any) -> ChatParsing:
    return ChatParsing(EngineConfig(**flags), tokenizer)


def split_feed(parser, text: str, rng: random.Random) -> list:
    events, i = [], 0
    while i < len(text):
        j = i + rng.randint(0, 6)
        events += parser.feed(text[i:j])
        i = j
    return events + parser.finish()


# ---- flags --------------------------------------------------------------------------------------------


def test_the_flag_choices_are_the_registries():
    assert set(get_args(ToolCallParser)) == set(TOOL_PARSERS)
    assert set(get_args(ReasoningParserName)) == set(REASONING_PARSERS)


def test_vllm_flags_land_in_engine_config(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    from flashstate.cli import _parser, _resolve

    c = _resolve(
        _parser().parse_args(
            ["serve", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]
            + ["--reasoning-parser", "qwen3", "--chat-template", str(template)]
            + ["--no-tool-parser-stream-arguments"]
        )
    )
    assert (c.enable_auto_tool_choice, c.tool_call_parser, c.reasoning_parser) == (
        True,
        "qwen3_coder",
        "qwen3",
    )
    assert c.chat_template == str(template) and not c.tool_parser_stream_arguments
    assert EngineConfig().tool_parser_stream_arguments  # vLLM's incremental arguments by default


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--enable-auto-tool-choice"], "needs tool_call_parser"),
        (["--chat-template", "no/such/template.jinja"], "neither a file nor a template"),
    ],
)
def test_bad_tool_flags_are_one_line_errors(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_chat_template_that_does_not_parse_fails_before_the_model_loads(capsys):
    assert main(["serve", "--chat-template", "{% if %}"]) == 1
    assert "does not parse" in capsys.readouterr().err


def test_an_unknown_parser_name_is_refused_by_the_command_line(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--tool-call-parser", "nope"])
    assert "invalid choice" in capsys.readouterr().err


# ---- the request plan ---------------------------------------------------------------------------------


def test_auto_tool_choice_needs_the_flags_as_in_vllm(tok):
    p = parsing(tok)
    for kw in ({"tool_choice": "auto"}, {}):  # tools without tool_choice mean "auto"
        with pytest.raises(APIError, match="requires --enable-auto-tool-choice") as e:
            p.plan(request(tools=TOOLS, **kw))
        assert e.value.status == 400 and e.value.param == "tool_choice"
    assert p.plan(request(tools=TOOLS, tool_choice="none")).mode == "none"
    assert p.plan(request(tool_choice="auto")).mode == "none"  # nothing to call
    assert not p.plan(request()).parses  # no tools, no reasoning parser: the text is the content
    auto = parsing(tok, enable_auto_tool_choice=True, tool_call_parser="hermes").plan(request(tools=TOOLS))
    assert auto.mode == "auto" and auto.structured_output is None


def test_required_and_named_constrain_the_output(tok):
    p = parsing(tok)
    required = p.plan(request(tools=TOOLS, tool_choice="required"))
    assert required.mode == "required" and required.structured_output.json == required_schema(TOOLS)
    one = p.plan(request(tools=TOOLS, tool_choice="required", parallel_tool_calls=False))
    assert one.structured_output.json["maxItems"] == 1
    named = p.plan(request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "set_units"}}))
    assert (named.mode, named.named, named.structured_output.json) == ("named", "set_units", UNITS)
    for choice in ("required", {"type": "function", "function": {"name": "nope"}}):
        with pytest.raises(APIError):
            p.plan(
                request(tool_choice=choice)
                if choice == "required"
                else request(tools=TOOLS, tool_choice=choice)
            )


def test_the_required_schema_accepts_exactly_lists_of_valid_calls():
    schema = required_schema(TOOLS)
    good = [
        {"name": "get_weather", "parameters": {"city": "Lima", "days": 2}},
        {"name": "set_units", "parameters": {"metric": True}},
    ]
    jsonschema.validate(good, schema)
    for bad in (
        [],
        [{"name": "get_weather", "parameters": {"metric": True}}],
        [{"name": "other", "parameters": {}}],
        [{"name": "set_units"}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, required_schema(TOOLS, parallel=False))
    bare = [{"type": "function", "function": {"name": "now"}}]
    assert named_schema(bare, "now") == {"type": "object", "properties": {}}


def test_defs_are_gathered_where_their_references_point():
    def tool(name: str, defs: dict) -> dict:
        params = {
            "type": "object",
            "properties": {"p": {"$ref": "#/$defs/P"}},
            "required": ["p"],
            "$defs": defs,
        }
        return {"type": "function", "function": {"name": name, "parameters": params}}

    schema = required_schema([tool("a", {"P": {"type": "integer"}}), tool("b", {"P": {"type": "integer"}})])
    assert schema["$defs"] == {"P": {"type": "integer"}}
    jsonschema.validate([{"name": "b", "parameters": {"p": 3}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "b", "parameters": {"p": "x"}}], schema)
    with pytest.raises(APIError, match=r"\$defs/P"):
        required_schema([tool("a", {"P": {"type": "integer"}}), tool("b", {"P": {"type": "string"}})])


def test_finish_reasons_follow_vllm(tok):
    p = parsing(tok, enable_auto_tool_choice=True, tool_call_parser="hermes")
    auto = p.plan(request(tools=TOOLS))
    named = p.plan(request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "set_units"}}))
    assert auto.finish_reason("stop", True) == "tool_calls"
    assert auto.finish_reason("stop", False) == "stop"
    assert auto.finish_reason("length", True) == "length"
    assert named.finish_reason("stop", True) == "stop"


# ---- reading the output -------------------------------------------------------------------------------


REQUIRED_OUTPUTS = [
    '[{"name": "get_weather", "parameters": {"city": "Pa\\"ris}", "days": [1, {"a": "]"}]}}, '
    '{"parameters": {"metric": true}, "name": "set_units"}]',
    ' [ { "name" : "set_units" , "parameters" : { } } ] ',
    '[{"name": "get_weather", "parameters": {"city": "Li',  # the output stopped inside a call
    '[{"name": "set_units"}]',
    "not json at all",
]


@pytest.mark.parametrize("text", REQUIRED_OUTPUTS)
def test_required_output_streams_as_it_reads_whole(text):
    whole = RequiredCallsParser().extract(text)
    rng = random.Random(text)
    for _ in range(40):
        content, calls = collect(split_feed(RequiredCallsParser(), text, rng))
        assert content == whole[0]
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole[1]]


def test_required_output_calls():
    content, calls = RequiredCallsParser().extract(REQUIRED_OUTPUTS[0])
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": 'Pa"ris}', "days": [1, {"a": "]"}]}),
        ("set_units", {"metric": True}),
    ]
    assert RequiredCallsParser().extract(REQUIRED_OUTPUTS[3])[1][0].arguments == "{}"
    assert RequiredCallsParser().extract("not json at all") == ("not json at all", [])
    content, (call,) = NamedCallParser("set_units").extract(' {"metric": false}')
    assert content is None and (call.name, call.arguments) == ("set_units", '{"metric": false}')


def test_the_special_text_filter_removes_whole_tokens_however_split():
    f = SpecialTextFilter(frozenset({"<|im_end|>", "<|im_start|>"}))
    text = "a<|im_start|>b<|im_e|>c<|im_end|>"
    rng = random.Random(0)
    for _ in range(30):
        f = SpecialTextFilter(frozenset({"<|im_end|>", "<|im_start|>"}))
        pieces, i = [], 0
        while i < len(text):
            j = i + rng.randint(0, 4)
            pieces.append(f.feed(text[i:j]))
            i = j
        assert "".join(pieces) + f.finish() == "ab<|im_e|>c"


def test_a_tag_the_tokenizer_marks_special_is_decoded_and_the_others_dropped(tiny_model_dir, tok):
    marked = Tokenizer.from_dir(tiny_model_dir)
    marked.backend.add_special_tokens([special_token("<tool_call>"), special_token("</tool_call>")])
    plan = parsing(marked, enable_auto_tool_choice=True, tool_call_parser="hermes").plan(request(tools=TOOLS))
    assert plan.keep_special_tokens and "<tool_call>" not in plan.strip and "<|im_end|>" in plan.strip
    params = plan.sampling_params(request().to_sampling_params())
    assert params.skip_special_tokens is False
    ids = marked.encode(
        'hi<|im_start|><tool_call>{"name": "set_units", "arguments": {"metric": true}}</tool_call>'
    )
    assert "<tool_call>" not in marked.decode(ids)  # what skipping special tokens would have done
    text = marked.decode(ids, skip_special_tokens=params.skip_special_tokens)
    message = plan.parser("", streamed=False).message(text)
    assert message["content"] == "hi"
    assert message["tool_calls"][0]["function"] == {"name": "set_units", "arguments": '{"metric": true}'}
    # the default tokenizer marks neither tag: nothing changes
    plain = parsing(tok, enable_auto_tool_choice=True, tool_call_parser="hermes").plan(request(tools=TOOLS))
    assert not plain.keep_special_tokens


def test_reasoning_then_calls_streamed_equal_whole(tok):
    p = parsing(tok, enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")
    plan = p.plan(request(tools=TOOLS))
    text = (
        "<think>\nThe user wants Paris.\n</think>\n\nLet me look.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    )
    whole = plan.parser("", streamed=False).message(text)
    assert whole["reasoning_content"] == whole["reasoning"] == "The user wants Paris."
    assert whole["content"] == "Let me look."
    assert json.loads(whole["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris", "days": 3}
    rng = random.Random(1)
    for _ in range(30):
        parser, deltas, i = plan.parser("", streamed=True), [], 0
        while i < len(text):
            j = i + rng.randint(0, 7)
            deltas.append(parser.feed(text[i:j]))
            i = j
        deltas.append(parser.finish())
        got = fold([d for d in deltas if d])
        assert got["reasoning_content"] == whole["reasoning_content"] and got["content"] == whole["content"]
        assert [c["function"] for c in got["tool_calls"]] == [c["function"] for c in whole["tool_calls"]]
        assert parser.called
    hidden = p.plan(request(tools=TOOLS, include_reasoning=False)).parser("", streamed=False).message(text)
    assert hidden["reasoning"] is None and hidden["content"] == "Let me look."


def test_a_malformed_call_is_content(tok):
    plan = parsing(tok, enable_auto_tool_choice=True, tool_call_parser="hermes").plan(request(tools=TOOLS))
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call> oops'
    message = plan.parser("", streamed=False).message(text)
    assert "tool_calls" not in message and message["content"] == text
    # streamed, with incremental arguments, the call went out as its name completed: it stands as written
    parser = plan.parser("", streamed=True)
    streamed = fold([d for d in (parser.feed(text), parser.finish()) if d])
    assert streamed["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": '}


def test_parallel_tool_calls_false_keeps_the_first_call(tok):
    plan = parsing(tok, enable_auto_tool_choice=True, tool_call_parser="hermes").plan(
        request(tools=TOOLS, parallel_tool_calls=False)
    )
    call = '<tool_call>\n{"name": "set_units", "arguments": {"metric": true}}\n</tool_call>\n'
    assert len(plan.parser("", streamed=False).message(call * 3)["tool_calls"]) == 1


def fold(deltas: list[dict]) -> dict:
    """Chunk deltas accumulated as a client does (text joined; tool calls by index)."""
    out: dict[str, Any] = {"content": None, "reasoning_content": None, "tool_calls": []}
    calls: dict[int, dict] = {}
    for d in deltas:
        for key in ("content", "reasoning_content"):
            if d.get(key):
                out[key] = (out[key] or "") + d[key]
        for c in d.get("tool_calls", []):
            if c["index"] not in calls:
                assert c.get("id") and c.get("type") == "function" and c["function"].get("name"), c
                calls[c["index"]] = {
                    "id": c["id"],
                    "function": {"name": c["function"]["name"], "arguments": ""},
                }
            else:
                assert "id" not in c and "name" not in c["function"], c
            calls[c["index"]]["function"]["arguments"] += c["function"].get("arguments", "")
    out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out


# ---- templates ----------------------------------------------------------------------------------------


def test_content_null_beside_tool_calls_and_arguments_text_reach_templates_as_vllm_sends_them(tiny_model_dir):
    tok = Tokenizer.from_dir(tiny_model_dir).with_chat_template(QWEN_STYLE_TEMPLATE)
    req = ChatCompletionRequest.model_validate({"messages": CALL_HISTORY, "tools": TOOLS})
    ids, positions = render_chat(tok, req)
    text = tok.decode(ids, skip_special_tokens=False)
    assert "<|im_start|>assistant\n\n<tool_call>\n<function=get_weather>\n" in text
    assert "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>" in text
    assert positions[-1] == len(ids)


def test_arguments_render_back_as_the_text_the_client_sent(tiny_model_dir):
    """The default (hermes-style) template writes `arguments | tojson`: the client's own text, so the
    turn the model generated is the same tokens in the next prompt (the prefix cache's hit)."""
    tok = Tokenizer.from_dir(tiny_model_dir)
    req = ChatCompletionRequest.model_validate({"messages": CALL_HISTORY})
    text = tok.decode(render_chat(tok, req)[0], skip_special_tokens=False)
    assert '{"name": "get_weather", "arguments": {"city":"Paris","days":3}}' in text


def test_generation_tags_render_their_body(tiny_model_dir):
    template = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    tok = Tokenizer.from_dir(tiny_model_dir).with_chat_template(template)
    assert tok.apply_chat_template(USER * 2) == f"[{USER[0]['content']}]" * 2


# ---- end to end ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(module_tmp):
    args = ["--max-model-len", "4k", "--prefill-cost-coefficients", "1e-5", "1e-10"]
    args += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"]
    with running_server(module_tmp, args) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def plain_server(module_tmp):
    """No tool flags; the Qwen-style template as --chat-template (its {% generation %} tags parse)."""
    here = module_tmp / "plain"
    here.mkdir(exist_ok=True)
    template = here / "qwen_style.jinja"
    template.write_text(QWEN_STYLE_TEMPLATE)
    args = ["--max-model-len", "4k", "--prefill-cost-coefficients", "1e-5", "1e-10"]
    with running_server(here, args + ["--chat-template", str(template)]) as s:
        yield s


def check_calls(calls: list, names: set[str] | None = None) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        assert call.function.name in (names or SCHEMAS)
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def stream_message(client: openai.OpenAI, **kw: Any) -> tuple[dict, str | None]:
    deltas, finish = [], None
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    for chunk in chunks:
        (choice,) = chunk.choices
        deltas.append(choice.delta.model_dump(exclude_none=True))
        if choice.finish_reason is not None:
            assert finish is None and chunk is chunks[-1]
            finish = choice.finish_reason
    return fold(deltas), finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_multi_turn_tool_loop_with_tool_choice_required(client, stream):
    messages = list(USER)
    for turn in range(3):
        kw = dict(messages=messages, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
        kw.update(max_tokens=200, temperature=0.8, seed=turn)
        if stream:
            message, finish = stream_message(client, **kw)
            calls = [
                openai.types.chat.ChatCompletionMessageToolCall.model_validate({"type": "function", **c})
                for c in message["tool_calls"]
            ]
            content = message["content"]
        else:
            choice = client.chat.completions.create(model=MODEL, **kw).choices[0]
            finish, calls, content = choice.finish_reason, choice.message.tool_calls, choice.message.content
        assert finish == "tool_calls"
        assert content is None and len(calls) == 1
        check_calls(calls)
        messages.append({"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"result {turn}"} for c in calls]


def test_required_allows_several_calls_each_valid(client):
    seen = 0
    for seed in range(4):
        choice = client.chat.completions.create(
            model=MODEL, messages=USER, tools=TOOLS, tool_choice="required", max_tokens=300, seed=seed
        ).choices[0]
        assert choice.finish_reason == "tool_calls"
        check_calls(choice.message.tool_calls)
        seen += len(choice.message.tool_calls)
    assert seen >= 4


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_named_tool_choice_calls_that_function(client, stream):
    kw = dict(
        messages=CALL_HISTORY,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "set_units"}},
        max_tokens=50,
        temperature=0.0,
    )
    if stream:
        message, finish = stream_message(client, **kw)
        (call,) = message["tool_calls"]
        name, arguments = call["function"]["name"], call["function"]["arguments"]
    else:
        choice = client.chat.completions.create(model=MODEL, **kw).choices[0]
        finish, (call,) = choice.finish_reason, choice.message.tool_calls
        name, arguments = call.function.name, call.function.arguments
    assert finish == "stop"  # OpenAI's and vLLM's answer for a named function
    assert name == "set_units"
    jsonschema.validate(json.loads(arguments), UNITS)


def test_streamed_and_whole_required_calls_agree(client):
    kw = dict(
        messages=USER, tools=TOOLS, tool_choice="required", max_tokens=300, seed=1
    )  # seeded: repeatable
    whole = client.chat.completions.create(model=MODEL, **kw).choices[0]
    streamed, finish = stream_message(client, **kw)
    assert finish == whole.finish_reason == "tool_calls"
    assert [c["function"] for c in streamed["tool_calls"]] == [
        {"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls
    ]


def test_auto_with_the_parser_never_fails_on_noise(client):
    """Random weights write no valid call: the noise is content, never a 500."""
    for stream in (False, True):
        kw = dict(messages=USER, tools=TOOLS, max_tokens=40, temperature=1.0, seed=5)
        if stream:
            message, finish = stream_message(client, **kw)
            assert finish in ("stop", "length", "tool_calls")
        else:
            choice = client.chat.completions.create(model=MODEL, **kw).choices[0]
            assert choice.finish_reason in ("stop", "length", "tool_calls")


def test_auto_without_the_flags_is_a_400(plain_server):
    for extra in ({"tool_choice": "auto"}, {}):
        status, body = plain_server.post_json(
            "/v1/chat/completions",
            {"model": MODEL, "messages": USER, "tools": TOOLS, "max_tokens": 2, **extra},
        )
        err = assert_error(status, body, 400)
        assert err["message"] == AUTO_NEEDS_FLAGS and err["param"] == "tool_choice"


def test_a_qwen_style_template_renders_content_null_beside_tool_calls(plain_server):
    with plain_server.client(timeout=120) as c:
        out = c.chat.completions.create(
            model=MODEL, messages=CALL_HISTORY, tools=TOOLS, tool_choice="none", max_tokens=2, temperature=0.0
        )
        assert out.choices[0].message.content is not None and out.choices[0].message.tool_calls is None
        with_history = out.usage.prompt_tokens
        out = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, temperature=0.0)
        assert with_history > out.usage.prompt_tokens


# Text in the Qwen3 thinking format, forced by a regex (`structured_outputs`, vLLM's field): the parsers
# then read real model output through the server's "auto" path.
THINK_THEN_CALL = (
    r"Paris, (three|four) days\.</think>\n\nChecking\.\n<tool_call>\n"
    r'\{"name": "get_weather", "arguments": \{"city": "(Paris|Lima)", "days": [1-7]\}\}\n</tool_call>'
)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_auto_reads_reasoning_content_and_calls_out_of_the_text(client, stream):
    kw = dict(messages=USER, tools=TOOLS, max_tokens=200, seed=3)
    kw["extra_body"] = {"structured_outputs": {"regex": THINK_THEN_CALL}}
    if stream:
        message, finish = stream_message(client, **kw)
        reasoning, content = message["reasoning_content"], message["content"]
        (call,) = message["tool_calls"]
        name, arguments = call["function"]["name"], call["function"]["arguments"]
    else:
        choice = client.chat.completions.create(model=MODEL, **kw).choices[0]
        finish, m = choice.finish_reason, choice.message
        reasoning, content = m.model_extra["reasoning_content"], m.content
        assert m.model_extra["reasoning"] == reasoning  # vLLM's newer name for it
        ((name, arguments),) = [(c.function.name, c.function.arguments) for c in m.tool_calls]
    assert finish == "tool_calls"
    assert reasoning.startswith("Paris, ") and reasoning.endswith(" days.")
    assert content == "Checking."
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER)


def test_reasoning_streamed_equals_whole_and_can_be_left_out(client):
    kw = dict(messages=USER, max_tokens=100, seed=4)
    kw["extra_body"] = {"structured_outputs": {"regex": r"[a-z ]{5,40}</think>\n\n[A-Z][a-z]{2,20}\."}}
    whole = client.chat.completions.create(model=MODEL, **kw).choices[0].message
    streamed, finish = stream_message(client, **kw)
    assert finish == "stop"
    assert streamed["reasoning_content"] == whole.model_extra["reasoning_content"]
    assert streamed["content"] == whole.content and whole.content.endswith(".")
    kw["extra_body"]["include_reasoning"] = False
    hidden = client.chat.completions.create(model=MODEL, **kw).choices[0].message
    assert hidden.model_extra["reasoning_content"] is None and hidden.content == whole.content


def test_a_tool_schema_that_cannot_constrain_is_a_400(server):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]
    body = {"model": MODEL, "messages": USER, "tools": bad, "tool_choice": "required"}
    err = assert_error(*server.post_json("/v1/chat/completions", body), 400)
    assert err["param"] == "tools" and "nonsense" in err["message"]
    both = {**body, "tools": TOOLS, "response_format": {"type": "json_object"}}
    assert assert_error(*server.post_json("/v1/chat/completions", both), 400)["param"] == "tool_choice"
