"""When a request is done, and which of its text may be streamed so far.

The checker and its IncrementalDetokenizer (detokenizer.py) only see a `decode(token_ids) -> str` callable,
never a tokenizer; bind the request's `skip_special_tokens` into it
(e.g. `lambda ids: tok.decode(ids, skip_special_tokens=True)`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from flashstate.engine.output.detokenizer import IncrementalDetokenizer
from flashstate.sampling_params import SamplingParams

__all__ = ["Decode", "Finish", "IncrementalDetokenizer", "StopChecker"]

Decode = Callable[[list[int]], str]


@dataclass(frozen=True, slots=True)
class Finish:
    reason: Literal["stop", "length"]
    stop_reason: int | str | None = None  # the stop token id or stop string; None for eos and length


class StopChecker:
    """One per request: feed it every generated token, in order. It says when the request is done
    and keeps the output text, of which it releases only the part that may be streamed:

        text: | < streamed > | < held: could be the start of a stop string > |
              0              streamed                                         len(text)

    Checks after each token, first match wins: eos (unless ignore_eos) -> "stop"; a stop token id ->
    "stop" with stop_reason = the id; a stop string anywhere in the text -> "stop" with stop_reason = the
    string, text cut before it (after it with include_stop_str_in_output); max_tokens -> "length".
    Before `min_tokens` tokens only max_tokens stops it (as vLLM's).
    A stop token's own text is left out unless include_stop_str_in_output.
    Among stop strings, the one whose occurrence ends first wins (then the longer one), so the outcome
    does not depend on how the text was split into tokens.
    """

    def __init__(
        self,
        params: SamplingParams,
        decode: Decode,
        eos_token_ids: Iterable[int] = (),
        prompt_token_ids: Sequence[int] = (),
    ):
        self.params = params
        self._eos = frozenset(() if params.ignore_eos else eos_token_ids)
        self._stop_ids = frozenset(params.stop_token_ids)
        self._detok = IncrementalDetokenizer(decode, prompt_token_ids)
        self.num_tokens = 0
        self.text = ""
        self.finish: Finish | None = None
        self._streamed = 0

    @property
    def finished(self) -> bool:
        return self.finish is not None

    def append(self, token_id: int) -> str:
        """Account for one generated token; returns the text to stream now (possibly "")."""
        if self.finish is not None:
            raise RuntimeError(f"request already finished ({self.finish})")
        p = self.params
        self.num_tokens += 1
        stoppable = self.num_tokens >= p.min_tokens  # before min_tokens nothing but the length stops it
        if stoppable and token_id in self._eos:
            self.finish = Finish("stop")
        elif stoppable and token_id in self._stop_ids:
            self.finish = Finish("stop", token_id)
        token_stop = self.finish is not None
        new = self._detok.add(token_id) if not token_stop or p.include_stop_str_in_output else ""
        at_length = p.max_tokens is not None and self.num_tokens >= p.max_tokens
        if token_stop or at_length:
            new += self._detok.flush()
        start = len(self.text)
        self.text += new
        if not token_stop and new and p.stop and stoppable:
            self._check_stop_strings(start)
        if self.finish is None and at_length:
            self.finish = Finish("length")
        return self._release()

    def _check_stop_strings(self, start: int) -> None:
        """Earlier text had no match, so any match ends in text[start:]."""
        best: tuple[int, int, str] | None = None  # (end, -len, stop)
        for stop in self.params.stop:
            i = self.text.find(stop, max(0, start - len(stop) + 1))
            if i >= 0:
                cand = (i + len(stop), -len(stop), stop)
                best = cand if best is None else min(best, cand)
        if best is None:
            return
        end, neg_len, stop = best
        self.text = self.text[: end if self.params.include_stop_str_in_output else end + neg_len]
        self.finish = Finish("stop", stop)

    def _release(self) -> str:
        end = len(self.text)
        if self.finish is None and not self.params.include_stop_str_in_output:
            end -= self._held_len()
        delta = self.text[self._streamed : end]
        self._streamed = max(self._streamed, end)
        return delta

    def _held_len(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of some stop string."""
        for k in range(min(len(self.text), self.params.max_stop_len - 1), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.params.stop):
                return k
        return 0
