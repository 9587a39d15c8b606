"""A step's token bitmask: one int32 row of ceil(V/32) words per sampling row, bit t % 32 of word t // 32
set where token t is allowed; rows without a grammar allow everything (-1 words).

One host buffer is reused (pinned on CUDA, so the upload is asynchronous): a step's mask is uploaded,
applied and sampled before the engine reads that step's tokens, and only then is the next step's mask
filled (constrained batches never run a step ahead).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import llguidance
import torch

from flashstate.engine.structured.matcher import GrammarMatcher

# Matchers filled in parallel threads when a step has at least this many (one is filled in place).
PARALLEL_FILL_ROWS = 2


class TokenBitmask:
    def __init__(self, vocab_size: int, pin: bool):
        """`vocab_size`: the mask's width in tokens (the grammar vocabulary's)."""
        self.words = -(-vocab_size // 32)
        self._pin = pin
        self._buffer = torch.empty(0, self.words, dtype=torch.int32)
        self._executor: llguidance.LLExecutor | None = None

    def build(self, matchers: Sequence[GrammarMatcher | None]) -> torch.Tensor | None:
        """The host bitmask [n, words] for sampling rows whose matchers are `matchers` (None: unconstrained);
        None when no row has a grammar. Valid until the next call."""
        rows = [(m.raw, i) for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return None
        n = len(matchers)
        if self._buffer.shape[0] < n:
            self._buffer = torch.empty(max(n, 2 * self._buffer.shape[0], 8), self.words, dtype=torch.int32)
            if self._pin:
                self._buffer = self._buffer.pin_memory()
        mask = self._buffer[:n]
        if len(rows) < n:
            mask.fill_(-1)
        if len(rows) < PARALLEL_FILL_ROWS:
            for m, i in rows:
                m.unsafe_compute_mask_ptr(mask[i].data_ptr(), self.words * 4)
        else:
            if self._executor is None:
                self._executor = llguidance.LLExecutor(num_threads=max(1, min(8, (os.cpu_count() or 1) - 1)))
            self._executor.unsafe_compute_mask_ptr(rows, mask.data_ptr(), self.words * 4, n)
        return mask
