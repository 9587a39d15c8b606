"""Streamed text == the final text == decode(all generated ids), on real `tokenizers` tokenizers: byte-level
BPE (the embedded one), SentencePiece-style (Metaspace "▁" pieces) and word-level, each with special
tokens, skipped or kept. With a prompt before the output, a SentencePiece or word-level decode may add one
leading space that the decode of the generated ids alone strips (the completion continues its prompt)."""

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from flashstate.default_tokenizer import build_default_tokenizer
from flashstate.engine.output.detokenizer import IncrementalDetokenizer
from flashstate.engine.output.stop_checker import StopChecker
from flashstate.sampling_params import SamplingParams

SPECIALS = ["<s>", "</s>", "<|im_end|>"]
WORDS = ["Hello", "world", "foo", "bar", ",", ".", "the", "a", "é", "日本"]


def _with_specials(tok: Tokenizer) -> Tokenizer:
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


@cache
def sentencepiece() -> Tokenizer:
    """Unigram over "▁"-prefixed pieces, Metaspace pre-tokenizer and decoder (Llama/T5-style)."""
    pieces = ["<unk>", *(f"▁{w}" for w in WORDS), *WORDS, "▁", "l", "o", "lo", "▁He", "llo"]
    tok = Tokenizer(models.Unigram([(p, -1.0 - i / 10) for i, p in enumerate(pieces)], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return _with_specials(tok)


@cache
def word_level() -> Tokenizer:
    """WordLevel without a decoder: `decode` joins the words with spaces."""
    vocab = {w: i for i, w in enumerate(["[UNK]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return _with_specials(tok)


@cache
def byte_level() -> Tokenizer:
    return build_default_tokenizer()


TOKENIZERS = {"byte_level": byte_level, "sentencepiece": sentencepiece, "word_level": word_level}


def ids_of(tok: Tokenizer) -> st.SearchStrategy[list[int]]:
    """Random id sequences, special tokens (and, byte-level, raw bytes that split characters) frequent."""
    n = tok.get_vocab_size()
    specials = [tok.token_to_id(s) for s in SPECIALS if tok.token_to_id(s) is not None]
    token = st.one_of(st.integers(0, n - 1), st.sampled_from(specials), st.integers(0, min(n, 256) - 1))
    return st.lists(token, max_size=24)


def streamed(tok: Tokenizer, ids: list[int], prompt: list[int], skip: bool) -> tuple[str, str]:
    """(concatenated deltas, final text) of a StopChecker fed `ids` one at a time."""

    def decode(x: list[int]) -> str:
        return tok.decode(x, skip_special_tokens=skip)

    params = SamplingParams(max_tokens=max(len(ids), 1), ignore_eos=True, skip_special_tokens=skip)
    checker = StopChecker(params, decode, prompt_token_ids=prompt)
    deltas = [checker.append(t) for t in ids]
    return "".join(deltas), checker.text


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(deadline=None, max_examples=150)
@given(data=st.data(), skip=st.booleans(), with_prompt=st.booleans())
def test_streamed_text_is_the_decode_of_all_ids(name, data, skip, with_prompt):
    tok = TOKENIZERS[name]()
    ids = data.draw(ids_of(tok), label="ids")
    prompt = data.draw(ids_of(tok), label="prompt") if with_prompt else []
    text, final = streamed(tok, ids, prompt, skip)
    want = tok.decode(ids, skip_special_tokens=skip)
    assert text == final
    if name == "byte_level" or not prompt:
        assert text == want
    else:  # the one leading space a decode after the prompt keeps
        assert text in (want, " " + want)


def test_no_space_lost_after_a_skipped_special_token():
    """The issue's case: "world" right after a skipped special token kept its space."""
    for tok in (sentencepiece(), word_level()):
        hello, world, end = (tok.token_to_id(t) for t in (tok.encode("Hello").tokens[0], "▁world", "</s>"))
        if tok is word_level():
            world = tok.token_to_id("world")
        ids = [hello, end, world]
        text, final = streamed(tok, ids, [], skip=True)
        assert text == final == tok.decode(ids) == "Hello world"


def test_sentencepiece_keeps_the_space_after_the_prompt():
    tok = sentencepiece()
    prompt, out = tok.encode("Hello").ids, tok.encode("world foo").ids
    text, _ = streamed(tok, out, prompt, skip=True)
    assert text == " world foo"
    assert streamed(tok, out, [], skip=True)[0] == "world foo" == tok.decode(out)


def test_window_stays_short():
    """A long output decodes a bounded window per token, not the whole text."""
    tok = byte_level()
    calls: list[int] = []

    def decode(x: list[int]) -> str:
        calls.append(len(x))
        return tok.decode(x)

    detok = IncrementalDetokenizer(decode, context=tok.encode("a b c d e f g").ids)
    ids = tok.encode("the quick brown fox jumps over the lazy dog " * 30).ids
    text = "".join(detok.add(t) for t in ids) + detok.flush()
    assert text == tok.decode(ids)
    assert max(calls) <= 8
