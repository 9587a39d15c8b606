"""SamplingParams: how one request picks its tokens and when it stops (vLLM-compatible names and defaults).

Conventions that differ from a literal copy of vLLM's fields:

- `top_k`: `None` means off. vLLM's "off" values `-1` and `0` are accepted and normalised to `None`;
  anything below `-1` is an error.
- `stop` is normalised to a tuple of non-empty strings (`()` when unset); `stop_token_ids` to a tuple
  of ints.
- `max_tokens=None` means no limit of its own: the engine generates up to the context limit
  (`max_model_len`, or what the KV cache can ever hold if that is less) and ends with "length".
- Values a request may carry are bounded here (finite floats, ints that fit the kernels, list sizes);
  bounds that depend on the model (the vocabulary for stop ids, top-k) are checked by the engine.
- `logprobs=k` asks for the chosen token's logprob plus the `k` most likely alternatives; `k = 0`
  means the chosen token only. Logprobs are vLLM's default "raw" mode: log-softmax of the model's logits
  before penalties, bias, temperature or filters.
- Penalties as vLLM's: `presence_penalty` and `frequency_penalty` (in [-2, 2]) over the generated tokens,
  `repetition_penalty` (> 0) over prompt and generated tokens; `logit_bias` maps token id -> bias
  (clamped to [-100, 100]); `allowed_token_ids` keeps only those ids; `min_tokens` masks eos and the stop
  token ids until that many tokens are generated. Ids are checked against the vocabulary by the engine.
- `n > 1` is served as n requests (branches) sharing the prompt's prefill: `branch(params, i)` gives
  branch i's params (n = 1; seed + i when seeded, as vLLM's parallel sampling).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from flashstate.structured_output import StructuredOutput

# Temperatures below this sample greedily (as in vLLM): dividing by them would overflow anyway.
GREEDY_TEMPERATURE = 1e-5
# A request's stop strings: how many, and how long each may be (every step scans the text for each).
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024  # entries of logit_bias, and of allowed_token_ids
MAX_N = 128  # branches of one request
LOGIT_BIAS_RANGE = 100.0  # biases are clamped to [-100, 100], as OpenAI and vLLM do
# torch.Generator.manual_seed's range.
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    """A finite real that converts to a float."""
    if not isinstance(x, int | float) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int past the float range
        return False


@dataclass(frozen=True, slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: str | list[str] | tuple[str, ...] | None = None  # a tuple of strings after __post_init__
    stop_token_ids: list[int] | tuple[int, ...] | None = None  # a tuple of ints after __post_init__
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured_output: StructuredOutput | None = None  # a grammar the output must follow
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | tuple[int, ...] | None = None  # a tuple after __post_init__
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be an int in [1, {MAX_N}], got {self.n!r}")
        if not _is_number(self.temperature) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None:
            if not _is_int(self.top_k) or self.top_k < -1:
                raise ValueError(f"top_k must be None, -1, 0 (all off) or a positive int, got {self.top_k!r}")
            if self.top_k <= 0:
                object.__setattr__(self, "top_k", None)
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and not (_is_int(self.seed) and SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]):
            raise ValueError(f"seed must be an int in [-2**63, 2**64) or None, got {self.seed!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an int >= 1 or None, got {self.max_tokens!r}")
        object.__setattr__(self, "stop", _normalise_stop(self.stop))
        object.__setattr__(self, "stop_token_ids", _normalise_stop_token_ids(self.stop_token_ids))
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            raise ValueError(f"logprobs must be an int >= 0 or None, got {self.logprobs!r}")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self._check_penalties()
        if self.structured_output is not None and not isinstance(self.structured_output, StructuredOutput):
            raise ValueError(f"structured_output must be a StructuredOutput, got {self.structured_output!r}")

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
        if not _is_number(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if self.logit_bias is not None:
            bias = self.logit_bias
            if not isinstance(bias, dict) or not all(
                _is_int(k) and k >= 0 and _is_number(v) for k, v in bias.items()
            ):
                raise ValueError(f"logit_bias must map token ids (ints >= 0) to numbers, got {bias!r}")
            if len(bias) > MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias may hold at most {MAX_LOGIT_BIAS} entries, got {len(bias)}")
            clamped = {k: max(-LOGIT_BIAS_RANGE, min(LOGIT_BIAS_RANGE, float(v))) for k, v in bias.items()}
            object.__setattr__(self, "logit_bias", clamped or None)
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if not isinstance(ids, list | tuple) or not ids or not all(_is_int(i) and i >= 0 for i in ids):
                raise ValueError(f"allowed_token_ids must be a non-empty list of token ids, got {ids!r}")
            if len(ids) > MAX_LOGIT_BIAS:
                raise ValueError(f"allowed_token_ids may hold at most {MAX_LOGIT_BIAS} ids, got {len(ids)}")
            object.__setattr__(self, "allowed_token_ids", tuple(ids))
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})")

    @property
    def penalised(self) -> bool:
        """Presence, frequency or repetition penalty: the sampler needs the row's token counts."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def adjusts_logits(self) -> bool:
        """Anything that changes the logits before sampling (penalties, bias, allowed ids, min_tokens)."""
        return (
            self.penalised
            or self.logit_bias is not None
            or self.allowed_token_ids is not None
            or self.min_tokens > 0
        )

    @property
    def greedy(self) -> bool:
        """Argmax decoding: temperature 0 (or below GREEDY_TEMPERATURE)."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def max_stop_len(self) -> int:
        """Length of the longest stop string (0 when there are none)."""
        return max((len(s) for s in self.stop), default=0)


def _normalise_stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) for s in stop):
        raise ValueError(f"stop must be a string or list of strings, got {stop!r}")
    if any(s == "" for s in stop):
        raise ValueError(f"stop strings must be non-empty, got {stop!r}")
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(stop)}")
    if any(len(s) > MAX_STOP_STRING_CHARS for s in stop):
        raise ValueError(f"stop strings may be at most {MAX_STOP_STRING_CHARS} characters long")
    return tuple(stop)


def _normalise_stop_token_ids(ids: object) -> tuple[int, ...]:
    if ids is None:
        return ()
    if not isinstance(ids, list | tuple) or not all(_is_int(i) and i >= 0 for i in ids):
        raise ValueError(f"stop_token_ids must be a list of non-negative ints, got {ids!r}")
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise ValueError(f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {len(ids)}")
    return tuple(ids)


def branch(params: SamplingParams, i: int) -> SamplingParams:
    """Branch i of a request with `n` > 1: one sequence (n = 1), seeded `seed + i` when seeded."""
    seed = params.seed
    if seed is not None:
        seed = (seed + i - SEED_RANGE[0]) % (SEED_RANGE[1] - SEED_RANGE[0] + 1) + SEED_RANGE[0]
    return dataclasses.replace(params, n=1, seed=seed)


def request_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """The per-request random stream of a seeded request (layers/sampler.py draws from it); None for
    unseeded ones."""
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)
