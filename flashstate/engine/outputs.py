"""What the engine reports per request after each step."""

from __future__ import annotations

from dataclasses import dataclass

from flashstate.engine.sequence import RequestStats


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated so far
    text: str  # generated text so far (stop strings removed)
    delta_token_ids: list[int]  # new since the previous output of this request
    delta_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort"
    stop_reason: int | str | None
    logprobs: list[float] | None
    stats: RequestStats
    prompt: str | None = None

    @property
    def num_cached_tokens(self) -> int:
        return self.stats.num_cached_tokens
