"""The tool-call parsers (flashstate/server/tool_parsers/): the formats the chat templates teach, what is not
a call, and streaming that equals the non-streamed answer for every way of splitting the text."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashstate.server.tool_parsers import (
    TOOL_PARSERS,
    ContentDelta,
    HermesToolParser,
    KimiK2ToolParser,
    NemotronJsonToolParser,
    Qwen3CoderToolParser,
    ToolCallDelta,
    ToolParser,
    collect,
    delta_message,
    get_tool_parser,
)
from flashstate.server.tool_parsers.qwen3_coder import convert

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "metric": {"type": "boolean"},
                    "filters": {"type": "object"},
                    "tags": {"type": ["array", "null"]},
                    "note": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                },
            },
        },
    }
]

# Outputs as the chat templates teach them (content around the calls, several calls).
HERMES = (
    "I'll look both up.\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "opts": {"u": "}", "l": [1, "]"]}}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name": "get_time", "arguments": {"tz": "Europe/Paris \\"CET\\""}}\n'
    "</tool_call>"
)
QWEN3_CODER = (
    "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
    '<parameter=filters>\n{"wind": true, "min": 1.5}\n</parameter>\n</function>\n</tool_call>\n'
    "<tool_call>\n<function=write_file>\n<parameter=content>\nline 1\n<b>not a tag</b>\n\nline 3\n"
    "</parameter>\n</function>\n</tool_call>"
)
KIMI = (
    "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
    '<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|><|tool_calls_section_end|>'
)
NEMOTRON_JSON = (
    'Sure.\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "get_time", "arguments": {}}]</TOOLCALL>'
)
FIXTURES = {"hermes": HERMES, "qwen3_coder": QWEN3_CODER, "kimi_k2": KIMI, "nemotron_json": NEMOTRON_JSON}


def summary(result: tuple[str | None, list]) -> tuple[str | None, list[tuple[str, str]]]:
    content, calls = result
    return content, [(c.name, c.arguments) for c in calls]


def stream(parser: ToolParser, chunks: list[str]) -> list:
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.finish()


def check_shape(events: list) -> None:
    """Each call opens with one event holding index, id and its whole name (arguments ""); after it only
    argument fragments; indices count up from 0."""
    seen: list[int] = []
    for e in events:
        if isinstance(e, ToolCallDelta):
            if e.index not in seen:
                assert e.index == len(seen)
                assert e.name and e.id and e.arguments == ""
                seen.append(e.index)
            else:
                assert e.name is None and e.id is None and e.arguments


def chunks_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def assert_streams_like_extract(parser: ToolParser, text: str, chunks: list[str]) -> None:
    events = stream(parser.fresh(), chunks)
    check_shape(events)
    assert summary(collect(events)) == summary(parser.extract(text))


# -- the formats


def test_hermes_reads_the_qwen_template_format():
    content, calls = HermesToolParser().extract(HERMES)
    assert content == "I'll look both up."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": "Paris", "days": 3, "opts": {"u": "}", "l": [1, "]"]}}
    assert calls[0].arguments == '{"city": "Paris", "days": 3, "opts": {"u": "}", "l": [1, "]"]}}'
    assert json.loads(calls[1].arguments) == {"tz": 'Europe/Paris "CET"'}


def test_hermes_other_shapes_are_parsed_whole():
    text = (
        '<tool_call>\n{"arguments": {"a": 1}, "name": "f"}\n</tool_call>'
        '<tool_call>{"name": "g", "arguments": "{\\"b\\": 2}"}</tool_call>'
    )
    content, calls = HermesToolParser().extract(text)
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1}), ("g", {"b": 2})]


def test_qwen3_coder_converts_by_schema():
    content, calls = Qwen3CoderToolParser(TOOLS).extract(QWEN3_CODER)
    assert content == "Let me check."
    assert calls[0].name == "get_weather"
    assert (
        calls[0].arguments
        == '{"city": "San Francisco", "days": 3, "metric": true, "filters": {"wind": true, "min": 1.5}}'
    )
    assert calls[1].name == "write_file"
    assert json.loads(calls[1].arguments) == {"content": "line 1\n<b>not a tag</b>\n\nline 3"}


def test_qwen3_coder_without_tools_keeps_strings():
    _, calls = Qwen3CoderToolParser().extract(QWEN3_CODER)
    assert json.loads(calls[0].arguments)["days"] == "3"
    assert json.loads(calls[0].arguments)["metric"] == "True"


@pytest.mark.parametrize(
    "raw, types, value",
    [
        ("42", ["integer"], 42),
        (" -7 ", ["integer"], -7),
        ("4.5", ["integer"], "4.5"),
        ("4.5", ["number"], 4.5),
        ("4", ["number"], 4),
        ("inf", ["number"], "inf"),
        ("true", ["boolean"], True),
        ("False", ["boolean"], False),
        ("yes", ["boolean"], "yes"),
        ('{"a": [1, 2]}', ["object"], {"a": [1, 2]}),
        ("{'a': None}", ["object"], {"a": None}),
        ("[1, 2]", ["object"], "[1, 2]"),
        ("[1, 'x']", ["array"], [1, "x"]),
        ("null", ["array", "null"], None),
        ("null", ["integer"], None),
        ("null", ["string"], "null"),
        ("12", ["integer", "string"], 12),
        ("twelve", ["integer", "string"], "twelve"),
        ("\nkeep  spaces ", ["string"], "\nkeep  spaces "),
        ("anything", [], "anything"),
    ],
)
def test_qwen3_coder_value_conversion(raw, types, value):
    assert convert(raw, types) == value


def test_qwen3_coder_several_functions_in_one_block_and_lenient_close():
    text = (
        "<tool_call>\n<function=a>\n<parameter=x>\n1\n</function>\n<function=b>\n</function>\n</tool_call>"
        "<tool_call><function=c><parameter=y>v</parameter></function></tool_call>"
    )
    _, calls = Qwen3CoderToolParser().extract(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("a", {"x": "1"}),
        ("b", {}),
        ("c", {"y": "v"}),
    ]


def test_kimi_keeps_the_native_id():
    content, calls = KimiK2ToolParser().extract(KIMI)
    assert content == "Checking."
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("functions.get_weather:0", "get_weather", '{"city": "Paris"}'),
        ("functions.get_time:1", "get_time", '{"tz": "CET"}'),
    ]


def test_kimi_bare_call_and_whitespace_around_arguments():
    text = '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>\n {"a": 1} \n<|tool_call_end|> Done'
    content, calls = KimiK2ToolParser().extract(text)
    assert content == "Done"
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}')]


def test_nemotron_json_list():
    content, calls = NemotronJsonToolParser().extract(NEMOTRON_JSON)
    assert content == "Sure."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]


def test_no_calls_is_all_content():
    for name, cls in TOOL_PARSERS.items():
        assert cls().extract("Just an answer, 1 < 2 and a {brace}.\n") == (
            "Just an answer, 1 < 2 and a {brace}.\n",
            [],
        )
        assert cls().extract("  \n") == (None, []), name
        assert cls().extract("") == (None, []), name


def test_content_between_calls_stays_separated():
    text = 'Before.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n\nAfter.\n'
    assert summary(HermesToolParser().extract(text)) == ("Before.\n\nAfter.\n", [("f", "{}")])


# -- what is not a call

MALFORMED = {
    "hermes": [
        "Use the <tool_call> tag.",
        "<tool_call>\nnot json\n</tool_call>",
        '<tool_call>\n{"name": 5, "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>',
        '<tool_call>\n{"arguments": {}, "name": "f"}',  # other key order, never closed
        '<tool_call>\n{"name": "f", "argu',
        '<tool_call>\n{"name": "',
        "<tool_call",
        "</tool_call>",
    ],
    "qwen3_coder": [
        "Write <tool_call> then text.",
        '<tool_call>\n{"name": "f"}\n</tool_call>',
        "<tool_call>\n<function=bad\nname>\n</function>\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weath",
        "<tool_call>\n<func",
        "<function=f>\n</function>",
    ],
    "kimi_k2": [
        "<|tool_call_begin|>has space:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "<|tool_call_begin|>functions.get_wea",
        "<|tool_call_begin|>functions.f:0<|tool_calls_section_end|>",
        "<|tool_call_arg",
    ],
    "nemotron_json": [
        '<TOOLCALL>[{"name": "f"',
        "<TOOLCALL>not json</TOOLCALL>",
        '<TOOLCALL>[{"name": "f", "arguments": 3}]</TOOLCALL>',
        '<TOOLCALL>[{"name": "f", "arguments": {}}, 7]</TOOLCALL>',
    ],
}


@pytest.mark.parametrize("name, text", [(n, t) for n, ts in MALFORMED.items() for t in ts])
def test_malformed_calls_are_content(name, text):
    parser = get_tool_parser(name)(TOOLS)
    content, calls = parser.extract(text)
    assert calls == []
    assert content == (text if text.strip() else None)
    for mode in (False, True):
        parser = get_tool_parser(name)(TOOLS, stream_arguments=mode)
        for i in range(len(text) + 1):
            assert_streams_like_extract(parser, text, [text[:i], text[i:]])


CUT_INSIDE_A_NAMED_CALL = [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": "par', [("f", '{"a": "par')]),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1', [("f", '{"a": 1')]),
    (
        "qwen3_coder",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\nhal",
        [("f", '{"a": "1"}')],
    ),
    ("qwen3_coder", "<tool_call>\n<function=f>", [("f", "{}")]),
    (
        "kimi_k2",
        '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": "par',
        [("f", '{"a": "par')],
    ),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>', [("f", '{"a": }')]),
]


@pytest.mark.parametrize("name, text, calls", CUT_INSIDE_A_NAMED_CALL)
def test_a_call_cut_short_or_broken(name, text, calls):
    """Held (the default), such a call is content; with `stream_arguments` its header went out when its
    name was complete, so it stays a call with the arguments as far as they came."""
    assert get_tool_parser(name)().extract(text) == (text, [])
    assert summary(get_tool_parser(name)(stream_arguments=True).extract(text)) == (None, calls)


# -- streaming


def test_header_first_then_argument_fragments():
    events = stream(Qwen3CoderToolParser(TOOLS, stream_arguments=True), list(QWEN3_CODER))
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls[0] == ToolCallDelta(0, "", calls[0].id, "get_weather")
    assert re.fullmatch(r"call_[0-9a-f]{24}", calls[0].id or "")
    assert [e.arguments for e in calls if e.index == 0][1:] == [
        '{"city": "San Francisco"',
        ', "days": 3',
        ', "metric": true',
        ', "filters": {"wind": true, "min": 1.5}',
        "}",
    ]


def test_held_calls_go_out_whole_when_complete():
    parser = Qwen3CoderToolParser(TOOLS)
    head, end = QWEN3_CODER.split("</function>", 1)
    out = parser.feed(head)
    assert out == [ContentDelta("Let me check.")]
    out = parser.feed("</function>")
    assert [type(e) for e in out] == [ToolCallDelta, ToolCallDelta]
    assert out[0].name == "get_weather" and out[0].arguments == "" and out[1].name is None
    assert json.loads(out[1].arguments)["filters"] == {"wind": True, "min": 1.5}


@pytest.mark.parametrize("mode", [False, True], ids=["held", "streamed"])
@pytest.mark.parametrize("name", list(FIXTURES))
def test_names_are_never_streamed_half(name, mode):
    parser = get_tool_parser(name)(TOOLS, stream_arguments=mode)
    text = FIXTURES[name]
    for size in (1, 2, 3, 5):
        events = stream(parser.fresh(), [text[i : i + size] for i in range(0, len(text), size)])
        names = [e.name for e in events if isinstance(e, ToolCallDelta) and e.name is not None]
        assert names == [c.name for c in parser.extract(text)[1]]


@pytest.mark.parametrize(
    "name, head, tag",
    [
        ("hermes", "Hi there ", "<tool_call>"),
        ("qwen3_coder", "Hi there ", "<tool_call>"),
        ("kimi_k2", "Hi there ", "<|tool_calls_section_begin|>"),
        ("nemotron_json", "Hi there ", "<TOOLCALL>"),
    ],
)
def test_a_possible_tag_start_is_held_back(name, head, tag):
    for k in range(1, len(tag)):
        parser = get_tool_parser(name)()
        out = parser.feed(head + tag[:k])
        assert "".join(e.text for e in out if isinstance(e, ContentDelta)) == head.rstrip()
        rest = parser.feed("x") + parser.finish()  # not a tag after all: it comes out as content
        assert "".join(e.text for e in rest if isinstance(e, ContentDelta)) == " " + tag[:k] + "x"


def test_hermes_arguments_stream_before_the_call_ends():
    parser = HermesToolParser(stream_arguments=True)
    out = parser.feed('<tool_call>\n{"name": "write", "arguments": {"text": "a long')
    assert out[0].name == "write" and out[1] == ToolCallDelta(0, '{"text": "a long')
    assert parser.feed(" file") == [ToolCallDelta(0, " file")]
    held = HermesToolParser()
    assert held.feed('<tool_call>\n{"name": "write", "arguments": {"text": "a long file"') == []


@pytest.mark.parametrize("mode", [False, True], ids=["held", "streamed"])
@pytest.mark.parametrize("name", list(FIXTURES))
def test_every_split_in_two_and_char_by_char(name, mode):
    parser = get_tool_parser(name)(TOOLS, stream_arguments=mode)
    text = FIXTURES[name]
    assert_streams_like_extract(parser, text, list(text))
    for i in range(len(text) + 1):
        assert_streams_like_extract(parser, text, [text[:i], text[i:]])


@pytest.mark.parametrize("mode", [False, True], ids=["held", "streamed"])
@pytest.mark.parametrize("name", list(FIXTURES))
def test_random_chunkings(name, mode):
    rng = random.Random(29)
    parser = get_tool_parser(name)(TOOLS, stream_arguments=mode)
    text = FIXTURES[name] + "\nthen <tool_call> <|tool_call_begin|> <TOOLCALL> and more"
    for _ in range(200):
        cuts = rng.sample(range(1, len(text)), rng.randint(1, 30))
        assert_streams_like_extract(parser, text, chunks_at(text, cuts))


# -- generated outputs

NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
SCALARS = st.one_of(
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
)
JSON_VALUES = st.recursive(
    SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(NAMES, kids, max_size=3), max_leaves=6
)
ARGS = st.dictionaries(NAMES, JSON_VALUES, max_size=4)
PLAIN = st.text(alphabet="abc xyz.,!?\n{}[]\"':", min_size=1, max_size=20).filter(lambda s: s.strip())
NOISE = st.lists(
    st.sampled_from(
        [
            "a",
            " ",
            "\n",
            "<",
            ">",
            "/",
            "{",
            "}",
            '"',
            "=",
            "|",
            "<tool_call>",
            "</tool_call>",
            "<tool_c",
            "<function=",
            "</function>",
            "<parameter=",
            "</parameter>",
            '{"name": "f", "arguments": {',
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "functions.f:0",
            "<TOOLCALL>",
            "</TOOLCALL>",
            "[",
            "]",
        ]
    ),
    max_size=25,
).map("".join)


def render(name: str, calls: list[tuple[str, dict]], index0: int, indent: int | None) -> str:
    if name == "hermes":
        return "\n".join(
            f"<tool_call>\n{json.dumps({'name': n, 'arguments': a}, indent=indent)}\n</tool_call>"
            for n, a in calls
        )
    if name == "qwen3_coder":
        out = []
        for n, a in calls:
            params = "".join(
                f"<parameter={k}>\n{json.dumps(v) if isinstance(v, dict | list) else v}\n</parameter>\n"
                for k, v in a.items()
            )
            out.append(f"<tool_call>\n<function={n}>\n{params}</function>\n</tool_call>")
        return "\n".join(out)
    if name == "kimi_k2":
        body = "".join(
            f"<|tool_call_begin|>functions.{n}:{index0 + i}<|tool_call_argument_begin|>"
            f"{json.dumps(a)}<|tool_call_end|>"
            for i, (n, a) in enumerate(calls)
        )
        return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"
    return "<TOOLCALL>" + json.dumps([{"name": n, "arguments": a} for n, a in calls]) + "</TOOLCALL>"


def _renders(name: str):
    """Whether a call's arguments can be written in `name`'s format: a qwen3_coder value runs to the first
    `</parameter>` or `</function>` after it (the format has no escape, and vLLM's parser reads it so too),
    so a value holding one cannot be written."""

    def ok(args: dict) -> bool:
        if name != "qwen3_coder":
            return True
        values = (json.dumps(v) if isinstance(v, dict | list) else str(v) for v in args.values())
        return not any(tag in v for v in values for tag in ("</parameter>", "</function>"))

    return ok


@st.composite
def outputs(draw, name: str) -> tuple[str, str | None, list[tuple[str, dict]]]:
    """A well-formed output: content pieces and call groups, with what parsing it must give."""
    pieces, contents, calls = [], [], []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            text = draw(PLAIN).strip()
            pieces.append(text)
            contents.append(text)
        else:
            group = draw(st.lists(st.tuples(NAMES, ARGS.filter(_renders(name))), min_size=1, max_size=2))
            pieces.append(render(name, group, len(calls), draw(st.sampled_from([None, 2]))))
            calls += group
    return "\n".join(pieces), ("\n".join(contents) or None), calls


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("mode", [False, True], ids=["held", "streamed"])
@pytest.mark.parametrize("name", list(FIXTURES))
@SETTINGS
@given(data=st.data())
def test_generated_outputs_parse_and_stream(name, mode, data):
    text, content, expected = data.draw(outputs(name))
    parser = get_tool_parser(name)(stream_arguments=mode)  # no tools: qwen3_coder values stay strings
    got_content, got = parser.extract(text)
    assert got_content == content
    assert [c.name for c in got] == [n for n, _ in expected]
    for call, (_, args) in zip(got, expected, strict=True):
        if name == "qwen3_coder":
            want = {k: (json.dumps(v) if isinstance(v, dict | list) else str(v)) for k, v in args.items()}
            assert json.loads(call.arguments) == want
        else:
            assert json.loads(call.arguments) == args
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert_streams_like_extract(parser, text, chunks_at(text, cuts))


@pytest.mark.parametrize("mode", [False, True], ids=["held", "streamed"])
@pytest.mark.parametrize("name", list(FIXTURES))
@SETTINGS
@given(data=st.data())
def test_any_text_never_raises_and_streams_like_extract(name, mode, data):
    text = data.draw(st.lists(st.one_of(NOISE, PLAIN), max_size=6).map("".join))
    parser = get_tool_parser(name)(TOOLS, stream_arguments=mode)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert_streams_like_extract(parser, text, chunks_at(text, cuts))
    assert_streams_like_extract(parser, text, list(text))


# -- the API around the parsers


def test_registry_and_special_tokens():
    assert {"hermes", "qwen3_coder", "kimi_k2", "nemotron_v3", "nemotron_json"} <= set(TOOL_PARSERS)
    assert get_tool_parser("nemotron_v3") is Qwen3CoderToolParser
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("nope")
    assert "<tool_call>" in HermesToolParser.special_tokens
    assert "<|tool_call_argument_begin|>" in KimiK2ToolParser.special_tokens
    assert "<TOOLCALL>" in NemotronJsonToolParser.special_tokens


def test_openai_shapes():
    parser = HermesToolParser()
    events = parser.feed('Hi <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>') + parser.finish()
    message = delta_message(events)
    call_id = message["tool_calls"][0]["id"]
    assert message == {
        "content": "Hi",
        "tool_calls": [
            {"index": 0, "id": call_id, "type": "function", "function": {"name": "f", "arguments": ""}},
            {"index": 0, "function": {"arguments": '{"a": 1}'}},
        ],
    }
    assert delta_message([]) is None
    (call,) = parser.extract('<tool_call>{"name": "f", "arguments": {}}</tool_call>')[1]
    assert call.to_openai() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }


def test_feed_after_finish_is_an_error_and_extract_leaves_the_stream_alone():
    parser = HermesToolParser()
    first = parser.feed("Hello <tool")
    assert parser.extract("other") == ("other", [])
    assert collect(first + parser.feed("_call>\n{") + parser.finish()) == ("Hello <tool_call>\n{", [])
    with pytest.raises(RuntimeError):
        parser.feed("more")
