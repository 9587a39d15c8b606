import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashstate.engine.output.stop_checker import Finish, IncrementalDetokenizer, StopChecker
from flashstate.sampling_params import SamplingParams


class Vocab:
    """A fake tokenizer: token id -> piece; byte pieces decode as UTF-8 with replacement."""

    def __init__(self, pieces: list[str] | list[bytes]):
        self.pieces = list(pieces)
        self.calls: list[int] = []  # length of every decode call

    def ids(self, *pieces) -> list[int]:
        return [self.pieces.index(p) for p in pieces]

    def decode(self, ids: list[int]) -> str:
        self.calls.append(len(ids))
        parts = [self.pieces[i] for i in ids]
        if parts and isinstance(parts[0], bytes):
            return b"".join(parts).decode("utf-8", errors="replace")
        return "".join(parts)


EOS = 0


def run(vocab: Vocab, pieces: list, eos: tuple[int, ...] = (EOS,), **kwargs) -> tuple[StopChecker, list[str]]:
    """Feed pieces until the checker finishes; returns it and the streamed deltas."""
    checker = StopChecker(SamplingParams(**kwargs), vocab.decode, eos_token_ids=eos)
    deltas = []
    for token_id in vocab.ids(*pieces):
        deltas.append(checker.append(token_id))
        if checker.finished:
            break
    return checker, deltas


WORDS = Vocab(["<eos>", "Hel", "lo ", "##", "# wo", "rld", "!", "<stop>"])


def test_length():
    checker, deltas = run(WORDS, ["Hel", "lo ", "rld", "!"], max_tokens=3)
    assert checker.finish == Finish("length")
    assert checker.num_tokens == 3
    assert checker.text == "Hello rld" == "".join(deltas)


def test_unfinished_until_max_tokens():
    checker, _ = run(WORDS, ["Hel", "lo "], max_tokens=3)
    assert not checker.finished and checker.finish is None


def test_no_max_tokens_never_finishes_by_length():
    checker, _ = run(WORDS, ["!"] * 100, max_tokens=None)
    assert not checker.finished and checker.text == "!" * 100


def test_eos_stops_and_its_text_is_left_out():
    checker, deltas = run(WORDS, ["Hel", "lo ", "<eos>", "!"])
    assert checker.finish == Finish("stop", None)
    assert checker.num_tokens == 3
    assert checker.text == "Hello " == "".join(deltas)


def test_eos_text_kept_with_include_stop_str_in_output():
    checker, _ = run(WORDS, ["Hel", "<eos>"], include_stop_str_in_output=True)
    assert checker.finish == Finish("stop", None)
    assert checker.text == "Hel<eos>"


def test_ignore_eos_runs_to_length():
    checker, deltas = run(WORDS, ["Hel", "<eos>", "!", "!"], ignore_eos=True, max_tokens=4)
    assert checker.finish == Finish("length")
    assert checker.text == "Hel<eos>!!" == "".join(deltas)


def test_several_eos_ids():
    checker, _ = run(WORDS, ["Hel", "!", "lo "], eos=(EOS, WORDS.ids("!")[0]))
    assert checker.finish == Finish("stop", None) and checker.text == "Hel"


def test_stop_token_id_sets_stop_reason():
    stop_id = WORDS.ids("<stop>")[0]
    checker, deltas = run(WORDS, ["Hel", "<stop>", "!"], stop_token_ids=[stop_id])
    assert checker.finish == Finish("stop", stop_id)
    assert checker.text == "Hel" == "".join(deltas)
    checker, _ = run(WORDS, ["Hel", "<stop>"], stop_token_ids=[stop_id], include_stop_str_in_output=True)
    assert checker.text == "Hel<stop>"


def test_stop_token_beats_length_on_the_same_step():
    stop_id = WORDS.ids("<stop>")[0]
    checker, _ = run(WORDS, ["Hel", "<stop>"], stop_token_ids=[stop_id], max_tokens=2)
    assert checker.finish == Finish("stop", stop_id)


def test_stop_string_straddling_tokens_is_cut_and_never_streamed():
    checker, deltas = run(WORDS, ["Hel", "lo ", "##", "# wo", "rld"], stop="###")
    assert checker.finish == Finish("stop", "###")
    assert checker.num_tokens == 4
    assert checker.text == "Hello "
    assert deltas == ["Hel", "lo ", "", ""]  # "##" was held back: it could start "###"


def test_stop_string_kept_with_include_stop_str_in_output_and_later_text_dropped():
    pieces = ["Hel", "lo ", "##", "# wo", "rld"]
    checker, deltas = run(WORDS, pieces, stop="###", include_stop_str_in_output=True)
    assert checker.finish == Finish("stop", "###")
    assert checker.text == "Hello ###" == "".join(deltas)


def test_held_text_released_when_it_stops_looking_like_a_stop_string():
    checker, deltas = run(WORDS, ["Hel", "##", "!", "lo "], stop="###!")
    assert not checker.finished
    assert deltas == ["Hel", "", "##!", "lo "]


def test_held_text_released_at_length():
    checker, deltas = run(WORDS, ["Hel", "##"], stop="###", max_tokens=2)
    assert checker.finish == Finish("length")
    assert deltas == ["Hel", "##"]


def test_stop_string_beats_length_on_the_same_step():
    checker, _ = run(WORDS, ["Hel", "lo "], stop="lo", max_tokens=2)
    assert checker.finish == Finish("stop", "lo") and checker.text == "Hel"


def test_first_ending_stop_string_wins():
    checker, _ = run(WORDS, ["Hel", "lo ", "rld"], stop=["world", "lo ", "el"])
    assert checker.finish == Finish("stop", "el") and checker.text == "H"
    # Same end: the longer one (which starts earlier) wins.
    checker, _ = run(WORDS, ["Hel", "lo "], stop=["o", "llo"])
    assert checker.finish == Finish("stop", "llo") and checker.text == "He"


def test_append_after_finish_raises():
    checker, _ = run(WORDS, ["Hel"], max_tokens=1)
    with pytest.raises(RuntimeError, match="already finished"):
        checker.append(1)


BYTES = Vocab([b"<eos>", b"a", b"\xe2\x82", b"\xac", b"b", b"\xe2", b"\x82\xac"])  # "€" = e2 82 ac


def test_detokenizer_holds_a_character_split_across_tokens():
    detok = IncrementalDetokenizer(BYTES.decode)
    deltas = [detok.add(t) for t in BYTES.ids(b"a", b"\xe2\x82", b"\xac", b"b", b"\xe2", b"\x82\xac")]
    assert deltas == ["a", "", "€", "b", "", "€"]
    assert detok.flush() == ""


def test_detokenizer_flush_releases_an_incomplete_character():
    detok = IncrementalDetokenizer(BYTES.decode)
    assert [detok.add(t) for t in BYTES.ids(b"a", b"\xe2\x82")] == ["a", ""]
    assert detok.flush() == "\ufffd"


def test_detokenizer_decodes_a_short_window_only():
    vocab = Vocab([b"x", b"\xe2\x82", b"\xac"])
    detok = IncrementalDetokenizer(vocab.decode, context=vocab.ids(*[b"x"] * 50))
    text = "".join(detok.add(t) for t in vocab.ids(*[b"x", b"\xe2\x82", b"\xac"] * 100))
    assert text == "x€" * 100
    assert max(vocab.calls) <= 6


def test_detokenizer_uses_prompt_context_for_leading_space():
    # SentencePiece-style: "▁" is a space, and a decode drops the space at its very start.
    pieces = ["▁Hello", "▁world", "!"]
    sp = Vocab(pieces)

    def decode(ids: list[int]) -> str:
        return sp.decode(ids).replace("▁", " ").removeprefix(" ")

    with_prompt = IncrementalDetokenizer(decode, context=sp.ids("▁Hello"))
    assert [with_prompt.add(t) for t in sp.ids("▁world", "!", "▁world")] == [" world", "!", " world"]
    alone = IncrementalDetokenizer(decode)
    assert [alone.add(t) for t in sp.ids("▁world", "▁world")] == ["world", " world"]


def test_stop_string_on_a_split_multibyte_character():
    checker, deltas = run(BYTES, [b"a", b"\xe2\x82", b"\xac", b"b"], stop="€")
    assert checker.finish == Finish("stop", "€")
    assert checker.text == "a" == "".join(deltas)


def test_length_flushes_an_incomplete_character():
    checker, deltas = run(BYTES, [b"a", b"\xe2\x82"], max_tokens=2)
    assert checker.finish == Finish("length")
    assert checker.text == "a\ufffd" == "".join(deltas)


def test_prompt_context_is_not_part_of_the_output():
    checker = StopChecker(SamplingParams(), WORDS.decode, prompt_token_ids=WORDS.ids("Hel", "lo "))
    assert checker.append(WORDS.ids("rld")[0]) == "rld"
    assert checker.text == "rld"


@st.composite
def split_text(draw):
    text = draw(st.text(alphabet="ab#", min_size=1, max_size=30))
    cuts = sorted(draw(st.sets(st.integers(1, len(text) - 1), max_size=len(text))) if len(text) > 1 else [])
    bounds = [0, *cuts, len(text)]
    return [text[i:j] for i, j in zip(bounds, bounds[1:], strict=False)]


@given(
    pieces=split_text(),
    stops=st.lists(st.text(alphabet="ab#", min_size=1, max_size=4), max_size=3),
    include=st.booleans(),
)
def test_outcome_does_not_depend_on_tokenization(pieces, stops, include):
    text = "".join(pieces)
    vocab = Vocab(["<eos>", *sorted(set(pieces))])
    checker, deltas = run(
        vocab, pieces, stop=stops, include_stop_str_in_output=include, max_tokens=len(pieces)
    )
    # Reference on the whole text: the occurrence that ends first, then the longest.
    matches = [(text.find(s) + len(s), -len(s), s) for s in stops if s in text]
    if matches:
        end, neg_len, stop = min(matches)
        assert checker.finish == Finish("stop", stop)
        assert checker.text == text[: end if include else end + neg_len]
    else:
        assert checker.finish == Finish("length")
        assert checker.text == text
    assert "".join(deltas) == checker.text
    # Streamed text never shows a stop string (unless asked to) and only grows.
    streamed = ""
    for delta in deltas:
        streamed += delta
        assert include or not any(s in streamed for s in stops)
