"""The reasoning parsers (flashstate/server/reasoning.py): `<think>…</think>` into reasoning and content,
where the output starts (inside reasoning or not), the implicit ends, and streaming that equals the
non-streamed answer for every way of splitting the text."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashstate.server.reasoning import (
    REASONING_PARSERS,
    DeepSeekR1ReasoningParser,
    KimiK2ReasoningParser,
    NemotronV3ReasoningParser,
    Qwen3ReasoningParser,
    ReasoningDelta,
    ReasoningParser,
    get_reasoning_parser,
)

NAMES = sorted(REASONING_PARSERS)
FIXTURES = [
    "Let me think about 1 < 2.\nYes.\n</think>\n\nThe answer is 2.",  # Qwen3.5: <think> was in the prompt
    "<think>\nHmm </thin k> <think> nested?\n</think>\n\nDone. </think> stays",  # the model wrote <think>
    "<think>\n\n</think>\n\nNo thoughts.",
    "cut short while thinking <",
    "I will call it.\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
    "Mentions <tool_call> in passing.\n</think>\nok",
    "plan<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}",
    "  \n",
    "",
]


def stream(parser: ReasoningParser, chunks: list[str]) -> tuple[str | None, str | None]:
    reasoning = content = ""
    for delta in [*(parser.feed(c) for c in chunks), parser.finish()]:
        reasoning += delta.reasoning
        content += delta.content
    return reasoning or None, content or None


def chunks_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def assert_streams_like_extract(parser: ReasoningParser, text: str, chunks: list[str]) -> None:
    fresh = type(parser)(parser.starts_in_reasoning)
    assert stream(fresh, chunks) == parser.extract(text)


# -- the split


@pytest.mark.parametrize("name", NAMES)
def test_the_end_tag_splits_reasoning_from_content(name):
    parser = get_reasoning_parser(name)()
    assert parser.extract(FIXTURES[0]) == ("Let me think about 1 < 2.\nYes.", "The answer is 2.")
    assert parser.extract(FIXTURES[1]) == ("Hmm </thin k> <think> nested?", "Done. </think> stays")
    assert parser.extract(FIXTURES[2]) == (None, "No thoughts.")


@pytest.mark.parametrize("name", NAMES)
def test_no_end_is_all_reasoning_when_the_output_starts_in_it(name):
    """A cut-short output (vLLM's qwen3 with thinking on, deepseek_r1, nemotron_v3, kimi_k2)."""
    assert get_reasoning_parser(name)().extract("cut short while thinking <") == (
        "cut short while thinking <",
        None,
    )
    assert get_reasoning_parser(name)().extract("<think>\ncut short") == ("cut short", None)


@pytest.mark.parametrize("name", NAMES)
def test_thinking_off_is_all_content_unless_the_output_opens_a_block(name):
    parser = get_reasoning_parser(name)(starts_in_reasoning=False)
    assert parser.extract("  The answer.") == (None, "  The answer.")
    assert parser.extract("The answer </think> here.") == (None, "The answer </think> here.")
    assert parser.extract("\n<think>\nfirst\n</think>\n\nthen") == ("first", "then")
    assert parser.extract("<think>unended") == ("unended", None)


def test_qwen3_tool_call_ends_reasoning_only_with_a_function_after_it():
    parser = Qwen3ReasoningParser()
    reasoning, content = parser.extract(FIXTURES[4])
    assert reasoning == "I will call it."
    assert content == "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"
    assert parser.extract(FIXTURES[5]) == ("Mentions <tool_call> in passing.", "ok")
    assert DeepSeekR1ReasoningParser().extract(FIXTURES[4]) == (FIXTURES[4], None)


def test_kimi_tool_section_ends_reasoning():
    reasoning, content = KimiK2ReasoningParser().extract(FIXTURES[6])
    assert reasoning == "plan"
    assert content == FIXTURES[6][len("plan") :]


def test_prompt_tells_where_the_output_starts():
    assert Qwen3ReasoningParser.starts_in_reasoning_for("<|im_start|>assistant\n<think>\n") is True
    assert (
        Qwen3ReasoningParser.starts_in_reasoning_for("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        is False
    )
    assert (
        NemotronV3ReasoningParser.starts_in_reasoning_for("<|im_start|>assistant\n<think></think>") is False
    )
    assert KimiK2ReasoningParser.starts_in_reasoning_for("<|im_assistant|>assistant<|im_middle|>") is None


# -- streaming


def test_a_possible_end_tag_and_trailing_whitespace_are_held_back():
    parser = Qwen3ReasoningParser()
    assert parser.feed("abc \n</thi") == ReasoningDelta("abc", "")
    assert parser.feed("nk>\n\n") == ReasoningDelta()
    assert parser.feed("x") == ReasoningDelta("", "x")
    parser = Qwen3ReasoningParser()
    assert parser.feed("so <tool_call>\n <func") == ReasoningDelta("so", "")
    assert parser.feed("tional> programming") == ReasoningDelta(" <tool_call>\n <functional> programming", "")
    parser = Qwen3ReasoningParser(starts_in_reasoning=False)
    assert parser.feed(" <thi") == ReasoningDelta()
    assert parser.feed("s") == ReasoningDelta("", " <this")


@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_every_split_in_two_char_by_char_and_random(name, flag):
    rng = random.Random(29)
    parser = get_reasoning_parser(name)(flag)
    for text in FIXTURES:
        assert_streams_like_extract(parser, text, list(text))
        for i in range(len(text) + 1):
            assert_streams_like_extract(parser, text, [text[:i], text[i:]])
        for _ in range(50):
            cuts = rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 12)))
            assert_streams_like_extract(parser, text, chunks_at(text, cuts))


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WORDS = st.text(alphabet="ab <>/\n=|", min_size=0, max_size=12)
NOISE = st.lists(
    st.one_of(
        WORDS,
        st.sampled_from(
            [
                "<think>",
                "</think>",
                "</thi",
                "<th",
                "<tool_call>",
                "<function=f>",
                "<func",
                "\n",
                "<|tool_calls_section_begin|>",
                "<|tool_calls",
            ]
        ),
    ),
    max_size=10,
).map("".join)


@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data())
def test_any_text_streams_like_extract(name, flag, data):
    text = data.draw(NOISE)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    parser = get_reasoning_parser(name)(flag)
    assert_streams_like_extract(parser, text, chunks_at(text, cuts))
    assert_streams_like_extract(parser, text, list(text))


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data())
def test_generated_outputs_split_right(name, data):
    words = st.text(alphabet="abc xy.<>/\n", max_size=30)
    reasoning = data.draw(words.filter(lambda s: "</think>" not in s and "<tool_call>" not in s))
    content = data.draw(words)
    opened = data.draw(st.booleans())  # the model wrote <think> itself (else the prompt did)
    text = ("<think>\n" if opened else "") + reasoning + "\n</think>\n\n" + content
    parser = get_reasoning_parser(name)()
    assert parser.extract(text) == (reasoning.strip() or None, content.lstrip() or None)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    assert_streams_like_extract(parser, text, chunks_at(text, cuts))


# -- the API


def test_registry_and_special_tokens():
    assert {"qwen3", "deepseek_r1", "nemotron_v3", "nano_v3", "kimi_k2"} <= set(REASONING_PARSERS)
    assert get_reasoning_parser("nano_v3") is NemotronV3ReasoningParser
    with pytest.raises(ValueError, match="qwen3"):
        get_reasoning_parser("nope")
    assert Qwen3ReasoningParser.special_tokens == ("<think>", "</think>", "<tool_call>")
    assert DeepSeekR1ReasoningParser.special_tokens == ("<think>", "</think>")
    assert "<|tool_calls_section_begin|>" in KimiK2ReasoningParser.special_tokens


def test_feed_after_finish_is_an_error_and_extract_leaves_the_stream_alone():
    parser = DeepSeekR1ReasoningParser()
    first = parser.feed("<think>a")
    assert parser.extract("x</think>y") == ("x", "y")
    rest = parser.feed("b</think>c")
    assert first.reasoning + rest.reasoning == "ab" and rest.content == "c"
    assert parser.finish() == ReasoningDelta()
    with pytest.raises(RuntimeError):
        parser.feed("more")
