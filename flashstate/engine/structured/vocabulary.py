"""The model tokenizer's vocabulary as llguidance sees it (token bytes, special tokens, eos), built once
per engine: about a second for a 150k-token vocabulary."""

from __future__ import annotations

import json
from collections.abc import Sequence

import llguidance

from flashstate.tokenizer import Tokenizer


def grammar_vocabulary(
    tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int]
) -> llguidance.LLTokenizer:
    """An LLTokenizer whose masks are `max(vocab_size, the tokenizer's size)` bits wide: ids past the
    tokenizer's vocabulary (the model's padding rows) are never allowed. The grammar allows the
    `eos_token_ids` only where it accepts the output."""
    spec = json.loads(tokenizer.backend.to_str())
    spec["padding"] = spec["truncation"] = None  # llguidance tokenizes forced text with it
    size = max(vocab_size, tokenizer.backend.get_vocab_size(with_added_tokens=True))
    return llguidance.LLTokenizer(json.dumps(spec), n_vocab=size, eos_token=list(eos_token_ids))
