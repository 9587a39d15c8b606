"""DecodeInputs: the inputs of a pure-decode batch, kept from one step to the next (a persistent batch).

Row i of the buffers is sequence i of the batch; rows [n, bs) are padding up to a captured graph size
(token 0 at position 0, its KV into the pad block, its state into the pad slot, no initial state).

From one step to the next a decode batch is mostly the same sequences in the same order, each one token
further on. The host work per step is then a gather of positions, tokens and state slots (C-level
iteration over the sequences), the block-table entries appended since the last step, and vectorised
numpy for the rest; rows are moved or loaded in full only when the batch changes. The host → device
transfer is one copy of the per-row fields and one small copy per grown table row:

    ints [5, max_batch] int64:  input_ids | positions | context_lens | slot_mapping | state_slots
    has_state [max_batch] bool
    tables [max_batch, max_blocks_per_seq] int64; row i holds its sequence's block table in [0, filled[i])

On CUDA the host buffers are pinned and the device buffers are separate (a captured graph reads them);
on the CPU the device buffers are the host ones.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from flashstate.layers.metadata import ForwardMetadata
from flashstate.sequence import Sequence

_INPUT_IDS, _POSITIONS, _CONTEXT_LENS, _SLOT_MAPPING, _STATE_SLOTS = range(5)
# Above this many grown rows one copy of the whole table beats one copy per row.
_ROW_COPIES = 8


class DecodeInputs:
    def __init__(
        self,
        max_batch: int,
        max_blocks_per_seq: int,
        block_size: int,
        pad_block: int,
        pad_slot: int,
        device: torch.device,
    ):
        self.max_batch, self.width = max_batch, max_blocks_per_seq
        self.block_size = block_size
        self.pad_block, self.pad_slot = pad_block, pad_slot
        self.device = device
        pin = device.type == "cuda"
        n, w = max_batch, max_blocks_per_seq
        self._ints_host = torch.zeros(5, n, dtype=torch.int64, pin_memory=pin)
        self._state_host = torch.zeros(n, dtype=torch.bool, pin_memory=pin)
        self._tables_host = torch.full((n, w), pad_block, dtype=torch.int64, pin_memory=pin)
        self._ints, self._state = self._ints_host.numpy(), self._state_host.numpy()
        self._tables = self._tables_host.numpy()
        if pin:
            self.ints = self._ints_host.to(device)
            self.has_state = self._state_host.to(device)
            self.tables = self._tables_host.to(device)
            self._uploaded = torch.cuda.Event()
        else:
            self.ints, self.has_state, self.tables = self._ints_host, self._state_host, self._tables_host
            self._uploaded = None
        self._cu = torch.arange(n + 1, dtype=torch.int64, device=device)
        self._empty = torch.zeros(0, dtype=torch.int64, device=device)
        # Per row of the last prepared batch: its sequence (kept alive, so ids stay unique), the id, the
        # block-table list the row mirrors and how many of its entries the row holds.
        self._seqs: list[Sequence] = []
        self._ids: list[int] = []
        self._sources: list[list[int]] = []
        self._filled = np.zeros(n, dtype=np.int64)
        self._grown: list[tuple[int, int, int]] = []  # (row, first, stop) entries to upload
        self._full_upload = True
        self.pad(0, n)

    def forget(self) -> None:
        """Drop the rows of the last batch: the next `prepare` loads every row and uploads in full."""
        self._seqs, self._ids, self._sources = [], [], []
        self._filled[:] = 0
        self._grown.clear()
        self._full_upload = True

    def input_ids(self, bs: int) -> Tensor:
        return self.ints[_INPUT_IDS, :bs]

    def metadata(self, bs: int) -> ForwardMetadata:
        """Views of the device buffers for the first bs rows (a graph captures these)."""
        d = self.ints
        return ForwardMetadata(
            cu_seqlens=self._cu[: bs + 1],
            positions=d[_POSITIONS, :bs],
            context_lens=d[_CONTEXT_LENS, :bs],
            slot_mapping=d[_SLOT_MAPPING, :bs],
            block_tables=self.tables[:bs],
            block_size=self.block_size,
            state_slots=d[_STATE_SLOTS, :bs],
            has_initial_state=self.has_state[:bs],
            export_token_ids=self._empty,
            export_slots=self._empty,
            query_lens_cpu=[1] * bs,
        )

    def pad(self, start: int, stop: int) -> None:
        h = self._ints
        h[_INPUT_IDS, start:stop] = 0
        h[_POSITIONS, start:stop] = 0
        h[_CONTEXT_LENS, start:stop] = 1
        h[_SLOT_MAPPING, start:stop] = self.pad_block * self.block_size
        h[_STATE_SLOTS, start:stop] = self.pad_slot
        self._state[start:stop] = False

    def prepare(self, seqs: Seq[Sequence], bs: int, ahead: bool = False) -> None:
        """Fill rows [0, len(seqs)) for one decode token of each sequence and pad rows up to bs.

        `ahead`: the step after the one in flight, whose tokens are not known yet: positions are one further
        and the input ids are left for `feed` to write on the device."""
        n = len(seqs)
        if self._uploaded is not None:  # the last upload may still be reading the host buffers
            self._uploaded.synchronize()
        ids = list(map(id, seqs))
        if ids != self._ids:
            self._remap(seqs, ids)
        sources = [s.block_table for s in seqs]
        for row in [r for r in range(n) if sources[r] is not self._sources[r]]:
            self._load_row(row, sources[row])  # the table was replaced (re-admitted after a preemption)
        lens = np.fromiter(map(len, sources), dtype=np.int64, count=n)
        filled = self._filled
        for row in np.flatnonzero(lens > filled[:n]).tolist():
            first, stop = int(filled[row]), int(lens[row])
            self._tables[row, first:stop] = sources[row][first:stop]
            filled[row] = stop
            self._grown.append((row, first, stop))
        h = self._ints
        pos = np.fromiter((s.num_computed_tokens for s in seqs), dtype=np.int64, count=n)
        if ahead:
            pos += 1
        else:
            h[_INPUT_IDS, :n] = np.fromiter(
                (s.token_ids[s.num_computed_tokens] for s in seqs), dtype=np.int64, count=n
            )
        h[_POSITIONS, :n] = pos
        h[_CONTEXT_LENS, :n] = pos + 1
        bt = self.block_size
        h[_SLOT_MAPPING, :n] = self._tables[np.arange(n), pos // bt] * bt + pos % bt
        h[_STATE_SLOTS, :n] = np.fromiter((s.state_slot for s in seqs), dtype=np.int64, count=n)
        self._state[:n] = pos > 0
        if bs > n:
            self.pad(n, bs)
            self._tables[n:bs, 0] = self.pad_block
            if self._filled[n:bs].any():
                self._filled[n:bs] = 0
                self._full_upload = True

    def _remap(self, seqs: Seq[Sequence], ids: list[int]) -> None:
        """The batch changed: move surviving rows to their new place, load new sequences in full."""
        old = {i: r for r, i in enumerate(self._ids)}
        n = len(seqs)
        src = np.fromiter((old.get(i, -1) for i in ids), dtype=np.int64, count=n)
        kept = np.flatnonzero(src >= 0)
        moved = kept[src[kept] != kept]
        if moved.size:
            self._tables[moved] = self._tables[src[moved]]  # the right side is a copy: overlaps are safe
            self._filled[moved] = self._filled[src[moved]]
        old_sources = self._sources
        self._sources = [old_sources[r] if r >= 0 else None for r in src.tolist()]
        self._seqs, self._ids = list(seqs), ids
        for row in np.flatnonzero(src < 0).tolist():
            self._load_row(row, seqs[row].block_table)
        self._filled[n:] = 0
        self._full_upload = True

    def _load_row(self, row: int, table: list[int]) -> None:
        if len(table) > self.width:
            raise ValueError(f"a block table of {len(table)} blocks exceeds the decode width {self.width}")
        self._tables[row, : len(table)] = table
        self._filled[row] = len(table)
        self._sources[row] = table
        self._full_upload = True

    def feed(self, token_ids: Tensor, stop_ids: Tensor | None) -> None:
        """After `upload` of an `ahead` batch: the input ids are the previous step's sampled `token_ids` [n]
        (on the device); a row whose token is one of its `stop_ids` [n, K] (-1 padded) ends its request,
        so its step runs into the pad block and pad slot and no live KV or state is touched."""
        n = token_ids.shape[0]
        self.ints[_INPUT_IDS, :n] = token_ids
        if stop_ids is None:
            return
        done = (token_ids[:, None] == stop_ids).any(dim=1)
        self.ints[_STATE_SLOTS, :n].masked_fill_(done, self.pad_slot)
        self.ints[_SLOT_MAPPING, :n].masked_fill_(done, self.pad_block * self.block_size)
        self.has_state[:n].masked_fill_(done, False)

    def upload(self, bs: int) -> bool:
        """Copy the prepared rows to the device (CUDA; nothing to do on the CPU). True if rows of the block
        tables changed since the last upload."""
        tables_changed = self._full_upload or bool(self._grown)
        if self._uploaded is None:
            self._grown.clear()
            self._full_upload = False
            return tables_changed
        self.ints.copy_(self._ints_host, non_blocking=True)
        self.has_state.copy_(self._state_host, non_blocking=True)
        if self._full_upload or len(self._grown) > _ROW_COPIES:
            self.tables[:bs].copy_(self._tables_host[:bs], non_blocking=True)
        else:
            for row, first, stop in self._grown:
                self.tables[row, first:stop].copy_(self._tables_host[row, first:stop], non_blocking=True)
        self._grown.clear()
        self._full_upload = False
        self._uploaded.record()
        return tables_changed
