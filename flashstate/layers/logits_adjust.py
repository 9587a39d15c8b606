"""LogitsAdjust: the per-step changes a request makes to its logits before sampling (vLLM's order).

    logits --logit_bias, allowed_token_ids, min_tokens--> --repetition--> --frequency, presence--> adjusted

- `logit_bias`: added to its tokens' logits; `allowed_token_ids`: every other token is -inf; `min_tokens`:
  while fewer tokens than that are generated, eos and the stop token ids are -inf.
- repetition penalty r over every token of the prompt and the output: a positive logit is divided by r,
  a negative one multiplied by it.
- frequency penalty f and presence penalty p over the output: logit -= f * count + p * (count > 0).

Only the rows that ask for any of these are touched (`rows`), so a batch without them pays nothing. The
counts are built on the device each step: each row's token ids, padded with an id past the vocabulary,
scattered into a [R, V + 1] count tensor whose last column (the padding) is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from flashstate.device import upload
from flashstate.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class AdjustRow:
    """One batch row's inputs: its params, its prompt and generated ids, and the ids that end it (eos
    unless ignore_eos, and the stop token ids), which `min_tokens` masks."""

    index: int
    params: SamplingParams
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    stop_ids: Iterable[int]


@dataclass(frozen=True, slots=True)
class LogitsAdjust:
    rows: Tensor  # [R] int64: the batch rows adjusted
    additive: Tensor | None  # [R, V] fp32: logit bias, -inf on masked tokens; None when no row has either
    output_counts: Tensor | None  # [R, V] fp32: generated-token counts; None without penalties
    seen: Tensor | None  # [R, V] bool: in the prompt or the output; None without a repetition penalty
    presence: Tensor  # [R] fp32
    frequency: Tensor  # [R] fp32
    repetition: Tensor  # [R] fp32

    @classmethod
    def build(cls, rows: Sequence[AdjustRow], vocab: int, device: torch.device | str) -> LogitsAdjust | None:
        """None when no row adjusts its logits (the sampler's fast path)."""
        rows = [r for r in rows if r.params.adjusts_logits]
        if not rows:
            return None
        n = len(rows)
        additive = None
        masked_rows = [
            (j, r) for j, r in enumerate(rows) if r.params.allowed_token_ids is not None or _masks_stops(r)
        ]
        bias_rows = [(j, r) for j, r in enumerate(rows) if r.params.logit_bias]
        if masked_rows or bias_rows:
            additive = torch.zeros(n, vocab, dtype=torch.float32, device=device)
            for j, r in masked_rows:
                allowed = r.params.allowed_token_ids
                if allowed is not None:
                    keep = torch.full((vocab,), float("-inf"), device=device)
                    keep[upload(list(allowed), torch.long, device)] = 0.0
                    additive[j] = keep
            if bias_rows:
                ri, ti, vals = [], [], []
                for j, r in bias_rows:
                    for t, b in r.params.logit_bias.items():
                        ri.append(j)
                        ti.append(t)
                        vals.append(b)
                idx = (upload(ri, torch.long, device), upload(ti, torch.long, device))
                additive.index_put_(idx, upload(vals, torch.float32, device), accumulate=True)
            stops = [(j, t) for j, r in masked_rows if _masks_stops(r) for t in r.stop_ids]
            if stops:
                idx = tuple(upload(list(c), torch.long, device) for c in zip(*stops, strict=True))
                additive.index_put_(idx, torch.tensor(float("-inf"), device=device))
        counts = seen = None
        if any(r.params.penalised for r in rows):
            counts = _counts([r.output_ids for r in rows], vocab, device)
            if any(r.params.repetition_penalty != 1 for r in rows):
                seen = (_counts([r.prompt_ids for r in rows], vocab, device) > 0) | (counts > 0)
        return cls(
            rows=upload([r.index for r in rows], torch.long, device),
            additive=additive,
            output_counts=counts,
            seen=seen,
            presence=upload([r.params.presence_penalty for r in rows], torch.float32, device),
            frequency=upload([r.params.frequency_penalty for r in rows], torch.float32, device),
            repetition=upload([r.params.repetition_penalty for r in rows], torch.float32, device),
        )

    def apply(self, logits: Tensor) -> Tensor:
        """logits [B, V] fp32 -> a new tensor with the adjusted rows changed (the input is left alone)."""
        sub = logits.index_select(0, self.rows)
        if self.additive is not None:
            sub = sub + self.additive
        if self.seen is not None:
            r = self.repetition[:, None]
            penalised = torch.where(sub > 0, sub / r, sub * r)
            sub = torch.where(self.seen, penalised, sub)
        if self.output_counts is not None:
            counts = self.output_counts
            sub = sub - self.frequency[:, None] * counts - self.presence[:, None] * (counts > 0)
        return logits.index_copy(0, self.rows, sub)


def _masks_stops(row: AdjustRow) -> bool:
    return len(row.output_ids) < row.params.min_tokens


def _counts(ids: list[Sequence[int]], vocab: int, device: torch.device | str) -> Tensor:
    """[R, V] fp32: how often each token occurs in each row's ids."""
    width = max(map(len, ids), default=0)
    out = torch.zeros(len(ids), vocab + 1, dtype=torch.float32, device=device)
    if width:
        padded = upload([list(x) + [vocab] * (width - len(x)) for x in ids], torch.long, device)
        out.scatter_add_(1, padded, torch.ones(padded.shape, dtype=torch.float32, device=device))
    return out[:, :vocab]
