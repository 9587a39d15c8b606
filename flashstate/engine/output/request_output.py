"""What the engine reports per request after each step.

An output is cheap to make: its token lists are slices of the sequence's own (append-only) lists, taken
when read, and its text comes from the request's TextStream when read (or is given, for requests whose
stop strings made the engine detokenise in the step loop).
"""

from __future__ import annotations

from flashstate.engine.output.text_stream import TextStream
from flashstate.sequence import RequestStats


class RequestOutput:
    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "finished",
        "finish_reason",
        "stop_reason",
        "stats",
        "prompt",
        "_tokens",
        "_start",
        "_prev",
        "_end",
        "_logprobs",
        "_top_logprobs",
        "_stream",
        "_text",
        "_delta_start",
        "error",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        tokens: list[int],
        start: int,
        prev: int,
        end: int,
        finished: bool,
        finish_reason: str | None,
        stop_reason: int | str | None,
        logprobs: list[float] | None,
        stats: RequestStats,
        prompt: str | None = None,
        text: tuple[str, str] | TextStream = ("", ""),
        error: str | None = None,
        top_logprobs: list[list[tuple[int, float]]] | None = None,
    ):
        """tokens[start:end] are the generated tokens so far, tokens[prev:end] the new ones; `text` is
        (text, delta_text), or the stream that detokenises them on demand (this output registers with it)."""
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids  # shared by all outputs of the request: do not mutate
        self.finished = finished
        self.finish_reason = finish_reason  # "stop" | "length" | "abort" | "error"
        self.error = error  # with finish_reason "error": why the engine failed the request
        self.stop_reason = stop_reason
        self.stats = stats
        self.prompt = prompt
        self._tokens, self._start, self._prev, self._end = tokens, start, prev, end
        self._logprobs = logprobs
        self._top_logprobs = top_logprobs
        self._stream: TextStream | None = None
        if isinstance(text, TextStream):
            self._stream = text
            text.register(self)
        else:
            self._text = text[0]
            self._delta_start = len(text[0]) - len(text[1])

    @property
    def token_ids(self) -> list[int]:
        """Generated so far."""
        return self._tokens[self._start : self._end]

    @property
    def delta_token_ids(self) -> list[int]:
        """New since the previous output of this request."""
        return self._tokens[self._prev : self._end]

    @property
    def logprobs(self) -> list[float] | None:
        return None if self._logprobs is None else self._logprobs[: self._end - self._start]

    @property
    def top_logprobs(self) -> list[list[tuple[int, float]]] | None:
        """Per generated token, the (token id, logprob) pairs of the `logprobs` most likely tokens, best
        first (raw logprobs, as `logprobs`); None when the request asked for no logprobs."""
        return None if self._top_logprobs is None else self._top_logprobs[: self._end - self._start]

    @property
    def text(self) -> str:
        """Generated text so far (stop strings removed)."""
        self._resolve()
        return self._text

    @property
    def delta_text(self) -> str:
        self._resolve()
        return self._text[self._delta_start :]

    @property
    def num_cached_tokens(self) -> int:
        return self.stats.num_cached_tokens

    def absorb(self, earlier: RequestOutput) -> RequestOutput:
        """This output widened to carry `earlier`'s new tokens and text too: `earlier` is the output of the
        same request just before this one, and nobody has read its deltas (a consumer catching up)."""
        self._resolve()  # passes `earlier` too: outputs resolve in order
        earlier._resolve()
        self._prev = earlier._prev
        self._delta_start = earlier._delta_start
        return self

    def _resolve(self) -> None:
        if self._stream is not None:
            self._stream.resolve(self)

    def _set_text(self, stream: TextStream, start: int, end: int) -> None:
        # stream.text is exactly `end` characters long now, and strings are immutable: keep it.
        self._stream = None
        self._text, self._delta_start = stream.text, start

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id!r}, token_ids={self.token_ids}, "
            f"finished={self.finished}, finish_reason={self.finish_reason!r})"
        )
