"""GrammarMatcher: one request's place in its grammar.

Per step: `fill` writes the tokens the grammar allows next into a bitmask row (bit t of word t // 32
is token t), the sampler draws among them, and `advance` consumes the drawn token. Once `done`, the
grammar takes no more tokens (its output is complete, or it allows only eos, which it has taken): the
request finishes with "stop". Eos is allowed only where the grammar accepts the output so far.
"""

from __future__ import annotations

import llguidance
import torch


class GrammarMatcher:
    __slots__ = ("_m",)

    def __init__(self, vocabulary: llguidance.LLTokenizer, grammar: str):
        """`grammar`: text from `compile_grammar` (checked, so building it does not fail)."""
        self._m = llguidance.LLMatcher(vocabulary, grammar, log_level=0)
        if self._m.is_error():
            raise ValueError(f"the grammar does not compile: {self._m.get_error()}")

    @property
    def raw(self) -> llguidance.LLMatcher:
        """The llguidance matcher (bitmask.py fills many in one call)."""
        return self._m

    def fill(self, row: torch.Tensor) -> None:
        """Write the next-token mask into `row`: a contiguous int32 CPU tensor of ceil(V/32) words."""
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def advance(self, token: int) -> bool:
        """Consume a sampled token; True when the grammar takes no more (the request is done). A token the
        grammar refuses (none is, when the mask was applied) also ends it."""
        return not self._m.consume_token(token) or self._m.is_stopped()

    @property
    def done(self) -> bool:
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far is complete (eos may follow)."""
        return self._m.is_accepting()

    @property
    def error(self) -> str | None:
        return self._m.get_error() or None
