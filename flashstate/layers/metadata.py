"""ForwardMetadata: the one explicit description of a batch, built by the model runner, passed down.

A batch holds N sequences, each contributing a span of new tokens; spans are flattened into T tokens.
For sequence i:

    | < cached: context_lens[i] - query_lens[i] > | < new: query_lens[i] > |
    0                                                                   context_lens[i]

    new tokens of i      = flat[cu_seqlens[i] : cu_seqlens[i + 1]]
    their KV goes to     = slot_mapping[...]  (block * block_size + offset in the paged KV pool)
    attention reads      = block_tables[i][: ceil(context_lens[i] / block_size)]
    recurrent state      = state pool slot state_slots[i]: read before the span (zeros when
                           has_initial_state[i] is False), overwritten with the state after it
    exports              = for each e: the state right after flat token export_token_ids[e],
                           written into state pool slot export_slots[e] (in the same pass)
    chunk_indices        = (sequence, chunk within it) of each FLA_CHUNK-token chunk of the spans, in
                           FLA's layout: built on the host, so no chunked kernel reads the lengths back
    token_seqs           = the sequence of each flat token (for the short conv)

A padded batch (`build(..., pad=P, pad_block=…)`, P ≥ 0, for fixed shapes) runs P more tokens at the end of
its last span (a list: P_i after span i): their KV goes to the pad block, `real_tokens` masks them out of the
recurrent updates (no decay, no write, so the state after them is the state after the last real token) and
`last_real` is where each span's state, conv window and next-token logits are read.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from flashstate.device import upload
from flashstate.ops.chunking import FLA_CHUNK


@dataclass(slots=True)
class ForwardMetadata:
    cu_seqlens: Tensor  # [N + 1] int64
    positions: Tensor  # [T] int64, absolute position of each new token
    context_lens: Tensor  # [N] int64
    slot_mapping: Tensor  # [T] int64
    block_tables: Tensor  # [N, max_blocks] int64, padded with 0 past each sequence's blocks
    block_size: int
    state_slots: Tensor  # [N] int64
    has_initial_state: Tensor  # [N] bool
    export_token_ids: Tensor  # [E] int64, flat token index; the state after that token
    export_slots: Tensor  # [E] int64
    query_lens_cpu: list[int]  # host copy, for the decode check and reference ops
    # (the shortest span, whether every span is a whole prompt), read on the host: what the attention ops
    # choose their kernel by without reading device tensors. None: not known (the decode graphs' inputs).
    spans: tuple[int, bool] | None = None
    chunk_indices: Tensor | None = None  # [C, 2] int64; None for a pure decode batch (no chunked pass)
    token_seqs: Tensor | None = None  # [T] int64; None for a pure decode batch
    real_tokens: Tensor | None = None  # [T] bool, False on pad tokens; None without a pad block
    last_real: Tensor | None = None  # [N] int64 flat index of each span's last real token; None likewise

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens_cpu))

    @property
    def is_decode(self) -> bool:
        """Every sequence contributes exactly one token."""
        return all(n == 1 for n in self.query_lens_cpu)

    @property
    def num_exports(self) -> int:
        return int(self.export_token_ids.numel())

    def to(self, device: torch.device | str) -> ForwardMetadata:
        """The same metadata with every tensor on `device`."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return ForwardMetadata(**{k: v.to(device) if isinstance(v, Tensor) else v for k, v in values.items()})

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        state_slots: list[int],
        has_initial_state: list[bool] | None = None,
        exports: list[tuple[int, int, int]] | None = None,
        device: torch.device | str = "cpu",
        pad: int | list[int] = 0,
        pad_block: int | None = None,
    ) -> ForwardMetadata:
        """Build from host lists.

        `exports`: (sequence index, number of new tokens of that sequence processed, destination slot);
        the count is in [1, query_lens[i]]: export (i, query_lens[i], s) copies the final state.
        `pad`: tokens run after the last span's real ones, or a list: after each span's, their KV into block
        `pad_block` (module docstring).
        """
        n = len(query_lens)
        pads = np.zeros(n, dtype=np.int64)
        if isinstance(pad, int):
            pads[-1:] = pad
        elif len(pad) == n:
            pads[:] = pad
        else:
            raise ValueError(f"{len(pad)} pads for {n} sequences")
        if (pads < 0).any() or (pads.any() and pad_block is None) or (pad and n == 0):
            raise ValueError(f"padding {pad} tokens needs a pad block and a sequence to pad")
        if not (len(context_lens) == len(block_tables) == len(state_slots) == n):
            raise ValueError(
                "query_lens, context_lens, block_tables and state_slots must have one entry per sequence"
            )
        if has_initial_state is None:
            has_initial_state = [c > q for q, c in zip(query_lens, context_lens, strict=True)]
        q = np.asarray(query_lens, dtype=np.int64).reshape(n)
        c = np.asarray(context_lens, dtype=np.int64).reshape(n)
        if pads.any():
            q += pads
            c += pads
            block_tables = [
                [*row, *[pad_block] * max(-(-int(ctx) // block_size) - len(row), 0)] if p else row
                for row, ctx, p in zip(block_tables, c, pads, strict=True)
            ]
        lens = np.fromiter((len(t) for t in block_tables), dtype=np.int64, count=n)
        for i in np.flatnonzero((q < 1) | (c < q)):
            raise ValueError(f"sequence {i}: need 1 <= query_len <= context_len, got {q[i]}, {c[i]}")
        for i in np.flatnonzero(lens * block_size < c):
            raise ValueError(f"sequence {i}: {lens[i]} blocks cannot hold {c[i]} tokens")
        cu = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(q, out=cu[1:])
        table = np.zeros((n, int(lens.max(initial=0))), dtype=np.int64)
        for i, row in enumerate(block_tables):
            table[i, : len(row)] = row
        owner = np.repeat(np.arange(n), q)  # the sequence of each flat token
        positions = np.arange(int(cu[-1]), dtype=np.int64) - cu[owner] + (c - q)[owner]
        slots = table[owner, positions // block_size] * block_size + positions % block_size
        chunks = -(-q // FLA_CHUNK)
        chunk_seq = np.repeat(np.arange(n), chunks)
        first = np.cumsum(chunks) - chunks  # each sequence's first chunk
        chunk_pos = np.arange(int(chunks.sum()), dtype=np.int64) - np.repeat(first, chunks)
        export_ids, export_slots = [], []
        for seq, count, slot in exports or []:
            if not 1 <= count <= query_lens[seq]:
                raise ValueError(f"export of sequence {seq} after {count} tokens is outside its span")
            export_ids.append(int(cu[seq]) + count - 1)
            export_slots.append(slot)
        # One host → device copy for every field (each upload costs a page-locked staging buffer and a
        # copy launch: ~0.3 ms of host time apiece on the H200's host), then views into it, each starting
        # 16-byte aligned as separate allocations would (Triton specialises kernels on pointer alignment).
        parts = {
            "cu_seqlens": cu,
            "positions": positions,
            "context_lens": c,
            "slot_mapping": slots,
            "block_tables": table.reshape(-1),
            "state_slots": np.asarray(state_slots, dtype=np.int64).reshape(n),
            "has_initial_state": np.asarray(has_initial_state, dtype=np.int64).reshape(n),
            "export_token_ids": np.asarray(export_ids, dtype=np.int64),
            "export_slots": np.asarray(export_slots, dtype=np.int64),
        }
        decode = n > 0 and bool((q == 1).all())
        if not decode:
            parts["chunk_indices"] = np.stack([chunk_seq, chunk_pos], 1).reshape(-1)
            parts["token_seqs"] = owner
        if pad_block is not None:
            parts["real_tokens"] = (np.arange(int(cu[-1])) < (cu[1:] - pads)[owner]).astype(np.int64)
            parts["last_real"] = cu[1:] - 1 - pads
        starts = np.cumsum([0] + [-(-x.size // 2) * 2 for x in parts.values()])
        packed = np.zeros(int(starts[-1]), dtype=np.int64)
        for start, part in zip(starts[:-1], parts.values(), strict=True):
            packed[start : start + part.size] = part
        flat = upload(packed, torch.int64, device)
        views = {name: flat[a : a + x.size] for (name, x), a in zip(parts.items(), starts[:-1], strict=True)}
        views["block_tables"] = views["block_tables"].view(table.shape)
        views["has_initial_state"] = views["has_initial_state"].bool()
        if not decode:
            views["chunk_indices"] = views["chunk_indices"].view(-1, 2)
        if pad_block is not None:
            views["real_tokens"] = views["real_tokens"].bool()
        return cls(
            **views,
            block_size=block_size,
            query_lens_cpu=q.tolist(),
            spans=(int(q.min()), bool((q == c).all())) if n else None,
        )
