"""RequestState: what the engine keeps per request besides its Sequence."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flashstate.engine.output.stop_checker import Finish, StopChecker
from flashstate.engine.output.text_stream import TextStream
from flashstate.engine.structured.matcher import GrammarMatcher
from flashstate.sequence import Sequence


@dataclass(slots=True)
class RequestState:
    """What the engine keeps per request besides its Sequence.

    A request with stop strings needs its text to know when it is done: its StopChecker runs in the step
    loop (`stop`, `text`). Every other request is decided on token ids alone (`eos`, `stop_ids`,
    `max_len`) and its text is detokenised by its TextStream when an output is read (`stream`)."""

    seq: Sequence
    prompt: str | None
    prompt_token_ids: list[int]  # one copy, shared by every output
    stop: StopChecker | None = None
    stream: TextStream | None = None
    eos: frozenset[int] = frozenset()
    stop_ids: frozenset[int] = frozenset()
    max_len: int | None = None  # len(seq.token_ids) at which max_tokens is reached
    text: str = ""  # with `stop`: streamed so far, never holding a possible stop-string prefix
    num_reported: int = 0  # len(seq.token_ids) at the previous output
    grammar: GrammarMatcher | None = None  # with params.structured_output: the output's place in its grammar
    # with params.logprobs: per generated token, the (id, logprob) pairs of the most likely tokens
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    fork_of: str | None = None  # an n > 1 request's first branch, whose prefill this branch waits for

    @classmethod
    def new(
        cls,
        seq: Sequence,
        prompt: str | None,
        decode: Callable[[list[int]], str],
        eos_token_ids: Iterable[int],
    ) -> RequestState:
        """The state of a request just queued as `seq` (its token ids are the prompt)."""
        params, n = seq.params, len(seq.token_ids)
        checker = StopChecker(params, decode, eos_token_ids, seq.token_ids)
        req = cls(seq, prompt, list(seq.token_ids), num_reported=n)
        if params.stop:
            req.stop = checker
        else:
            req.stream = TextStream(checker, seq.token_ids, n)
            req.eos = frozenset(() if params.ignore_eos else eos_token_ids)
            req.stop_ids = frozenset(params.stop_token_ids)
            req.max_len = None if params.max_tokens is None else n + params.max_tokens
        return req

    def finish_by_ids(self, token: int, length: int) -> Finish | None:
        """The StopChecker's decision for a request without stop strings, on ids only."""
        if token in self.eos:
            return EOS
        if token in self.stop_ids:
            return Finish("stop", token)
        if self.max_len is not None and length >= self.max_len:
            return LENGTH
        return None


EOS, LENGTH = Finish("stop"), Finish("length")
GRAMMAR_END = Finish("stop")  # the grammar takes no more tokens
