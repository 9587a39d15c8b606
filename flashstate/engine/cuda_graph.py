"""CUDA graphs for decode batches: one captured forward (model + logits) per padded batch size.

A graph reads its inputs from static device buffers; before a replay the runner writes the batch into
pinned host staging buffers and copies them over in one transfer per buffer. Rows past the batch are
padding: they decode token 0 at position 0 into the reserved pad block and pad slot (rows that belong
to no pool), with no initial state, so a replay never touches a live sequence's KV or state.

A model whose decode forward cannot be captured (an op that synchronises with the host, such as an MoE
router that looks up the selected experts) raises during capture; the runner then stays eager.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from flashstate.layers.metadata import ForwardMetadata
from flashstate.models.base import HybridForCausalLM


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_batch (vLLM's ladder, shortened)."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch + 1, 8))
    if not sizes or sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sorted(set(sizes))


class DecodeGraphs:
    def __init__(
        self,
        model: HybridForCausalLM,
        block_size: int,
        max_batch: int,
        max_blocks_per_seq: int,
        pad_block: int,
        pad_slot: int,
        device: torch.device,
    ):
        self.model = model
        self.block_size = block_size
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.pad_block, self.pad_slot = pad_block, pad_slot
        self.device = device
        n, w = self.max_batch, max_blocks_per_seq

        def pinned(*shape: int, dtype: torch.dtype = torch.int64) -> Tensor:
            return torch.zeros(shape, dtype=dtype, pin_memory=True)

        # host staging | device buffer, one pair per input
        self._host = {
            "input_ids": pinned(n),
            "positions": pinned(n),
            "context_lens": pinned(n),
            "slot_mapping": pinned(n),
            "state_slots": pinned(n),
            "has_initial_state": pinned(n, dtype=torch.bool),
        }
        self._dev = {k: v.to(device) for k, v in self._host.items()}
        self._np = {k: v.numpy() for k, v in self._host.items()}
        # Block tables travel compact ([bs, widest table used]) and are spread on the device: the full
        # [max_batch, max_blocks_per_seq] buffer is megabytes at long max_model_len.
        self._tables_host = pinned(n * w)
        self._tables_stage = torch.zeros(n * w, dtype=torch.int64, device=device)
        self._dev["block_tables"] = torch.zeros(n, w, dtype=torch.int64, device=device)
        self._table_shape = (0, 0)
        self._cu = torch.arange(n + 1, dtype=torch.int64, device=device)
        self._empty = torch.zeros(0, dtype=torch.int64, device=device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, Tensor] = {}
        self._pool = None

    def _meta(self, bs: int) -> ForwardMetadata:
        d = self._dev
        return ForwardMetadata(
            cu_seqlens=self._cu[: bs + 1],
            positions=d["positions"][:bs],
            context_lens=d["context_lens"][:bs],
            slot_mapping=d["slot_mapping"][:bs],
            block_tables=d["block_tables"][:bs],
            block_size=self.block_size,
            state_slots=d["state_slots"][:bs],
            has_initial_state=d["has_initial_state"][:bs],
            export_token_ids=self._empty,
            export_slots=self._empty,
            query_lens_cpu=[1] * bs,
        )

    def _forward(self, bs: int) -> Tensor:
        hidden = self.model(self._dev["input_ids"][:bs], self._meta(bs))
        return self.model.compute_logits(hidden).float()

    @torch.inference_mode()
    def capture(self) -> None:
        self._pad_rows(0, self.max_batch)
        self._tables_host.fill_(self.pad_block)
        self._table_shape = (self.max_batch, self._dev["block_tables"].shape[1])
        self._upload()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):  # largest first: later graphs fit in its memory pool
                for _ in range(2):  # warm-up: autotuning and lazy initialisation happen outside capture
                    self._forward(bs)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                    self._logits[bs] = self._forward(bs)
                if self._pool is None:
                    self._pool = graph.pool()
                self._graphs[bs] = graph
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def fits(self, batch_size: int) -> bool:
        return bool(self._graphs) and batch_size <= self.max_batch

    def _fill(
        self,
        tokens: list[int],
        positions: list[int],
        tables: list[np.ndarray],
        state_slots: list[int],
        has_state: list[bool],
    ) -> int:
        n = len(tokens)
        bs = next(s for s in self.sizes if s >= max(n, 1))
        h = self._np
        h["input_ids"][:n] = tokens
        h["positions"][:n] = positions
        h["context_lens"][:n] = np.asarray(positions, dtype=np.int64) + 1
        h["state_slots"][:n] = state_slots
        h["has_initial_state"][:n] = has_state
        bt = self.block_size
        width = max((len(t) for t in tables), default=1)
        compact = self._tables_host.numpy()[: bs * width].reshape(bs, width)
        compact[:] = self.pad_block
        for i, (table, p) in enumerate(zip(tables, positions, strict=True)):
            compact[i, : len(table)] = table
            h["slot_mapping"][i] = table[p // bt] * bt + p % bt
        self._table_shape = (bs, width)
        self._pad_rows(n, bs)
        return bs

    def _pad_rows(self, start: int, stop: int) -> None:
        h = self._np
        h["input_ids"][start:stop] = 0
        h["positions"][start:stop] = 0
        h["context_lens"][start:stop] = 1
        h["state_slots"][start:stop] = self.pad_slot
        h["has_initial_state"][start:stop] = False
        h["slot_mapping"][start:stop] = self.pad_block * self.block_size

    def _upload(self) -> None:
        for k, host in self._host.items():
            self._dev[k].copy_(host, non_blocking=True)
        bs, width = self._table_shape
        self._tables_stage[: bs * width].copy_(self._tables_host[: bs * width], non_blocking=True)
        self._dev["block_tables"][:bs, :width].copy_(self._tables_stage[: bs * width].view(bs, width))

    def run(
        self,
        tokens: list[int],
        positions: list[int],
        tables: list[np.ndarray],
        state_slots: list[int],
        has_state: list[bool],
    ) -> Tensor:
        """Decode one token for each of len(tokens) sequences → logits [n, V] (fp32)."""
        # The previous replay may still read the staging buffers through its copies: wait for it.
        torch.cuda.current_stream(self.device).synchronize()
        bs = self._fill(tokens, positions, tables, state_slots, has_state)
        self._upload()
        self._graphs[bs].replay()
        return self._logits[bs][: len(tokens)]
