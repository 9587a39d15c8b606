"""IncrementalDetokenizer: a request's output text, one token at a time, decoding a short window only.

The deltas it returns concatenate to `decode(all generated ids)`, for any decoder whose output for a
token depends only on the tokens before it through a start-of-decode rule (SentencePiece's Metaspace
strips the leading space of the first piece; word-level decoders put a space between two pieces;
skipped special tokens vanish) or through bytes (byte-level BPE joins the bytes of a character split
across tokens):

    tokens: | < anchor: its text was emitted > | < pending: text not yet complete > | new |
            0                                  read_offset                                len

    delta = decode(anchor + pending + new)[len(decode(anchor)):]

held back (kept pending) while the decoded window ends with U+FFFD, i.e. while a multi-byte character
may still be split across tokens. Invariants that make the delta exact:
- the anchor ends where a character ends (nothing is emitted while the text ends mid-character);
- the anchor decodes to some text, unless it starts at the first generated token: then the tokens after
  it are not the first a decode sees, as they are not in `decode(all)` (after a skipped special token, an
  anchor of only that token would make the next piece lose its space).

The prompt (`context`) changes one thing: a leading space that a decode of the generated ids alone
strips from the first piece (Metaspace, word-level joins) is kept when the same decode after the prompt's
last tokens has it, so a completion still continues its prompt (" world" after "Hello").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[list[int]], str]

# Prompt tokens decoded ahead of the first output piece to see whether it starts with a space.
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, decode: Decode, context: Sequence[int] = ()):
        """`context`: token ids before the first one to add (the prompt); only its tail is used."""
        self._decode = decode
        self._context = list(context[max(0, len(context) - PROMPT_CONTEXT_TOKENS) :])
        self._tokens: list[int] = []
        self._read_offset = 0
        self._at_start = True  # the window starts at the first generated token
        self._emitted = False  # any text released yet

    def add(self, token_id: int) -> str:
        """Append one token; returns the newly complete text (possibly "")."""
        self._tokens.append(token_id)
        return self._advance(force=False)

    def flush(self) -> str:
        """Text still held back (possibly ending in U+FFFD); call when the sequence ends."""
        return self._advance(force=True)

    def _advance(self, force: bool) -> str:
        if self._read_offset == len(self._tokens):
            return ""
        prefix = self._decode(self._tokens[: self._read_offset]) if self._read_offset else ""
        text = self._decode(self._tokens)
        if text.endswith("\ufffd") and not force:
            return ""
        delta = text[len(prefix) :]
        if delta and not self._emitted:
            self._emitted = True
            if self._at_start:
                delta = self._leading_space(text) + delta
        # pending + new becomes the anchor when it decodes to text; else the anchor grows by it
        if self._read_offset and self._decode(self._tokens[self._read_offset :]):
            del self._tokens[: self._read_offset]
            self._at_start = False
        self._read_offset = len(self._tokens)
        return delta

    def _leading_space(self, alone: str) -> str:
        """Whitespace the prompt's tail puts before the first text `alone` (decoded from the window at
        the first generated token) that the decode without it stripped."""
        if not self._context or not alone:
            return ""
        before = self._decode(self._context)
        joined = self._decode(self._context + self._tokens)
        if not (joined.startswith(before) and joined.endswith(alone)):
            return ""
        gap = joined[len(before) : len(joined) - len(alone)]
        return gap if gap.isspace() else ""
