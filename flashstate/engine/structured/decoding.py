"""StructuredDecoding: the engine's constrained decoding, one per engine.

`matcher(so)` gives a new request its GrammarMatcher (the grammar text from the shared compile cache; the
vocabulary built on first use and kept); `bitmask(matchers)` builds a step's mask for the rows that
sample. Matchers are made on the thread that builds requests and advanced on the engine thread; the
vocabulary is built once under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import llguidance
import torch

from flashstate.engine.structured.bitmask import TokenBitmask
from flashstate.engine.structured.grammar import compile_grammar
from flashstate.engine.structured.matcher import GrammarMatcher
from flashstate.engine.structured.vocabulary import grammar_vocabulary
from flashstate.structured_output import StructuredOutput
from flashstate.tokenizer import Tokenizer


class StructuredDecoding:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int], pin: bool):
        """`vocab_size`: the model's logits width; `pin`: host masks in pinned memory (a CUDA engine)."""
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = tuple(eos_token_ids)
        self._pin = pin
        self._vocabulary: llguidance.LLTokenizer | None = None
        self._bitmask: TokenBitmask | None = None
        self._lock = threading.Lock()

    @property
    def vocabulary(self) -> llguidance.LLTokenizer:
        if self._vocabulary is None:
            with self._lock:
                if self._vocabulary is None:
                    vocabulary = grammar_vocabulary(self._tokenizer, self._vocab_size, self._eos)
                    self._bitmask = TokenBitmask(vocabulary.vocab_size, self._pin)
                    self._vocabulary = vocabulary
        return self._vocabulary

    def matcher(self, so: StructuredOutput) -> GrammarMatcher:
        """A fresh matcher at the start of `so`'s grammar; GrammarError (a ValueError) if it does not
        compile."""
        return GrammarMatcher(self.vocabulary, compile_grammar(so))

    def bitmask(self, matchers: Sequence[GrammarMatcher | None]) -> torch.Tensor | None:
        """The host bitmask [n, ceil(V/32)] int32 of a step's sampling rows; None when none is constrained."""
        if self._bitmask is None:
            return None  # no matcher was ever made
        return self._bitmask.build(matchers)
