"""ReplayConfig: every knob of one replay run (`flashstate bench` flags land here once). Frozen."""

from __future__ import annotations

from dataclasses import dataclass

from flashstate.bench.prompts import DEFAULT_MAX_TOKEN_ID

MODES = ("completions", "chat")


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    base_url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: the server's first model
    api_key: str | None = None  # sent as `Authorization: Bearer` (a server started with --api-key)
    mode: str = "completions"  # completions (token-id prompts) | chat
    chat_thinking_share: float = 0.5  # chat: share of an answer the trace marks `thinking` not re-sent
    chat_tools: bool = True  # chat: tool definitions, calls and results where the trace has them
    agents: int = 4  # concurrent lanes
    warmup_s: float = 0.0
    duration_s: float = 60.0  # the measured window
    ramp_s: float = 0.0  # lane i starts at i · ramp_s / agents
    max_requests: int = 100_000
    max_sessions: int | None = None  # top-level sessions to draw; None: as many as the time allows
    time_scale: float = 1.0  # multiplies think times
    max_think_s: float | None = None
    length_scale: float = 1.0  # multiplies token lengths (block sizes, in, out)
    max_context: int | None = None  # prompt + max_tokens; None: the server's max_model_len
    max_output_tokens: int | None = None  # caps max_tokens
    temperature: float = 0.0
    seed: int = 0  # prompt content and the session draw order
    max_token_id: int = DEFAULT_MAX_TOKEN_ID
    request_timeout_s: float = 600.0
    drain_s: float = 60.0  # after the end, in-flight requests get this long to finish
    retries: int = 0  # a request that failed retryably (client.Completion.retryable) is sent again this often
    num_gpus: int = 1
    progress: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.agents < 1 or self.max_requests < 1:
            raise ValueError("agents and max_requests must be >= 1")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if min(self.warmup_s, self.ramp_s, self.time_scale) < 0 or self.duration_s <= 0:
            raise ValueError("duration_s must be > 0; warmup_s, ramp_s, time_scale >= 0")
        if not 0 <= self.chat_thinking_share <= 1:
            raise ValueError(f"chat_thinking_share must be in [0, 1], got {self.chat_thinking_share}")
        if self.length_scale <= 0:
            raise ValueError(f"length_scale must be > 0, got {self.length_scale}")
