"""Sampler: logits [B, V] -> one token per row, with the chosen token's logprob.

Per row, in this order (as in vLLM):

    logits --/temperature--> scaled --top-k--> --top-p--> --min-p--> masked --race--> token
    logits --log_softmax--> logprobs (of the raw logits, whatever the filters did)

Penalties, logit bias and token masks (layers/logits_adjust.py) change the logits first, after the
logprobs are taken; greedy rows take the argmax of the adjusted logits.

Greedy rows (temperature < GREEDY_TEMPERATURE) take argmax(logits) and skip the rest.

`vocab_limit` (the ids the tokenizer has a token for): logits [vocab_limit, V) are -inf from the start, so
those ids are never sampled and logprobs are over the ids that have text. A checkpoint's embedding often
has padding rows past its tokenizer (Qwen3-Next: 151,936 rows, 151,665 tokens; the 2B benchmark presets:
151,936 rows over the 2,048-token embedded tokenizer); an id sampled there decodes to nothing.

A token bitmask (constrained decoding: [B, ceil(V/32)] int32, bit t % 32 of word t // 32 set where token
t is allowed) puts -inf on the disallowed logits before anything else, so logprobs are those of the masked
distribution (as in vLLM). Every row of a bitmask allows at least one token.

The draw is an exponential race: token = argmax(probs / E) with E ~ Exp(1) i.i.d. per vocab entry,
which samples from `probs` exactly. Unseeded rows draw E from the global RNG in one batched call.
A seeded row draws its own E ([V] values per step) from its own torch.Generator, so its tokens depend
only on its logits and its generator: the same whatever other requests share the batch.

The generator belongs to the request (the engine's Sequence keeps it across steps, so successive steps
continue one stream); make it with `sampling_params.request_generator(params, device)`, i.e.
`torch.Generator(device).manual_seed(seed)`. A generator on another device than the logits also works
(the draw is copied over), at the cost of a transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from flashstate.device import upload
from flashstate.layers.logits_adjust import LogitsAdjust
from flashstate.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """The rows' sampling parameters as tensors, built once per batch."""

    temperatures: Tensor  # [B] fp32; 1.0 on greedy rows so dividing by it is always safe
    greedy: Tensor  # [B] bool
    top_k: Tensor  # [B] int64; 0 on rows without top-k
    top_p: Tensor  # [B] fp32; 1.0 means off
    min_p: Tensor  # [B] fp32; 0.0 means off
    generators: tuple[torch.Generator | None, ...]  # [B]; None: draw from the global RNG
    # Batch-wide facts known on the host, so the sampler never syncs to find them out.
    all_greedy: bool
    use_top_k: bool
    use_top_p: bool
    use_min_p: bool
    num_top_logprobs: int | None  # the largest `logprobs` asked for; None when no row asked

    @property
    def batch_size(self) -> int:
        return len(self.generators)

    @classmethod
    def build(
        cls,
        rows: Sequence[tuple[SamplingParams, torch.Generator | None]],
        device: torch.device | str = "cpu",
    ) -> SamplingBatch:
        """`rows[i]`: row i's params and its request's generator (required iff the params have a seed)."""
        for i, (params, gen) in enumerate(rows):
            if params.seed is not None and gen is None and not params.greedy:
                raise ValueError(f"row {i} has seed={params.seed} but no generator")
        params = [p for p, _ in rows]
        greedy = [p.greedy for p in params]
        asked = [p.logprobs for p in params if p.logprobs is not None]

        def t(x: list, dtype: torch.dtype) -> Tensor:
            return upload(x, dtype, device)

        return cls(
            temperatures=t(
                [1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)], torch.float32
            ),
            greedy=t(greedy, torch.bool),
            top_k=t([p.top_k or 0 for p in params], torch.int64),
            top_p=t([p.top_p for p in params], torch.float32),
            min_p=t([p.min_p for p in params], torch.float32),
            generators=tuple(None if p.greedy else g for p, g in rows),
            all_greedy=all(greedy),
            use_top_k=any(p.top_k is not None and not p.greedy for p in params),
            use_top_p=any(p.top_p < 1.0 and not p.greedy for p in params),
            use_min_p=any(p.min_p > 0.0 and not p.greedy for p in params),
            num_top_logprobs=max(asked, default=None),
        )


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    token_ids: Tensor  # [B] int64
    logprobs: Tensor  # [B] fp32, log_softmax(logits)[token]
    # The num_top_logprobs most likely tokens per row, best first; None when no row asked.
    # Row i wants only the first params[i].logprobs columns.
    top_token_ids: Tensor | None  # [B, K] int64
    top_logprobs: Tensor | None  # [B, K] fp32


class Sampler(nn.Module):
    def __init__(self, vocab_limit: int | None = None):
        super().__init__()
        self.vocab_limit = vocab_limit  # None: every id of the logits may be sampled

    def forward(
        self,
        logits: Tensor,
        batch: SamplingBatch,
        adjust: LogitsAdjust | None = None,
        token_bitmask: Tensor | None = None,
    ) -> SamplerOutput:
        """logits: [B, V] fp32 -> SamplerOutput with token_ids [B]. `adjust`: the step's penalties, bias and
        masks (layers/logits_adjust.py), applied after the logprobs are taken (vLLM's raw logprobs).
        `token_bitmask`: [B, W] int32 on the logits' device (constrained decoding), applied first."""
        if logits.dim() != 2 or logits.shape[0] != batch.batch_size:
            raise ValueError(f"logits must be [{batch.batch_size}, V], got {list(logits.shape)}")
        if self.vocab_limit is not None and self.vocab_limit < logits.shape[1]:
            # a copy, so the logits (a CUDA graph's output buffer) stay as they were
            logits = logits.float() if logits.dtype != torch.float32 else logits.clone()
            logits[:, self.vocab_limit :] = float("-inf")
        else:
            logits = logits.float()
        if token_bitmask is not None:
            logits = apply_token_bitmask(logits, token_bitmask)
        logprobs = torch.log_softmax(logits, dim=-1)
        if adjust is not None:
            logits = adjust.apply(logits)
        greedy_ids = logits.argmax(dim=-1)
        if batch.all_greedy:
            token_ids = greedy_ids
        else:
            masked = filter_logits(logits, batch)
            token_ids = torch.where(batch.greedy, greedy_ids, exponential_race(masked, batch.generators))
        top_ids = top_lp = None
        if batch.num_top_logprobs:
            top_lp, top_ids = logprobs.topk(min(batch.num_top_logprobs, logits.shape[1]), dim=-1)
        return SamplerOutput(
            token_ids=token_ids,
            logprobs=logprobs.gather(1, token_ids[:, None])[:, 0],
            top_token_ids=top_ids,
            top_logprobs=top_lp,
        )


def apply_token_bitmask(logits: Tensor, bitmask: Tensor) -> Tensor:
    """logits [B, V] with -inf where `bitmask` [B, W] int32 has a 0 bit (tokens past 32·W: all -inf); a new
    tensor, so the logits (a CUDA graph's output buffer) stay as they were."""
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).flatten(1).bool()  # [B, 32·W]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    return logits.masked_fill(~allowed[:, :vocab], float("-inf"))


def filter_logits(logits: Tensor, batch: SamplingBatch) -> Tensor:
    """Temperature, then top-k, top-p, min-p: logits [B, V] -> scaled logits with -inf on dropped tokens.

    Ties at a threshold are all kept (top-k may keep more than k tokens when values tie with the k-th).
    Every row keeps at least its most likely token.
    """
    scaled = logits / batch.temperatures[:, None]
    if not (batch.use_top_k or batch.use_top_p or batch.use_min_p):
        return scaled
    vocab = scaled.shape[1]
    sorted_logits = scaled.sort(dim=-1, descending=True).values  # [B, V]
    drop = torch.zeros_like(scaled, dtype=torch.bool)
    if batch.use_top_k:
        k = torch.where(batch.top_k > 0, batch.top_k.clamp(max=vocab), vocab)
        kth = sorted_logits.gather(1, (k - 1)[:, None])  # [B, 1]
        drop |= scaled < kth
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if batch.use_top_p:
        # Keep the shortest prefix (in descending order) whose mass reaches top_p: a token stays iff the
        # mass strictly before it is < top_p. Rows with top_p == 1 are exempt from rounding in the cumsum.
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs
        cut = (before >= batch.top_p[:, None]) & (batch.top_p[:, None] < 1.0)
        # The smallest kept sorted logit is the row's threshold.
        kept = sorted_logits.masked_fill(cut, float("inf"))
        threshold = kept.min(dim=-1, keepdim=True).values
        drop |= scaled < threshold
    if batch.use_min_p:
        # probs / max_prob = exp(logit - max_logit): no softmax needed.
        drop |= scaled < sorted_logits[:, :1] + torch.log(batch.min_p[:, None])
    return scaled.masked_fill(drop, float("-inf"))


def exponential_race(masked: Tensor, generators: Sequence[torch.Generator | None]) -> Tensor:
    """Sample one token per row from softmax(masked) [B, V]: argmax(masked - log E), E ~ Exp(1)."""
    noise = torch.empty_like(masked)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if len(unseeded) == len(generators):
        noise.exponential_()
    elif unseeded:
        noise[unseeded] = torch.empty(len(unseeded), masked.shape[1], device=masked.device).exponential_()
    for i, gen in enumerate(generators):
        if gen is not None:
            draw = torch.empty(masked.shape[1], device=gen.device).exponential_(generator=gen)
            noise[i] = draw.to(masked.device)
    # E == 0 would give log E = -inf and, on a dropped token, -inf + inf = nan.
    return (masked - noise.clamp_(min=torch.finfo(noise.dtype).tiny).log_()).argmax(dim=-1)
