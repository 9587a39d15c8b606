"""The flat tile list of a prefill batch for the paged attention kernel: tile p covers a run of query tokens
of one sequence. Built on the device without reading it back, and once per step."""

from __future__ import annotations

import torch
from torch import Tensor

_last: tuple | None = None  # (cu, tokens_per_tile, max_tiles, tiles): for the step's other layers


def tile_list(cu: Tensor, tokens_per_tile: int, max_tiles: int) -> tuple[Tensor, Tensor]:
    """Flat tile list: tile p covers tokens [tile_tok[p], + tokens_per_tile) of sequence tile_seq[p]
    (−1 past the last tile). Sync-free: `max_tiles` bounds the count from shapes alone. Every attention
    layer of a step passes the same `cu` tensor (the metadata's, never written in place), so the list is
    built once per step: the last one is kept, keyed by that tensor's identity. Not while a CUDA graph is
    captured: its input buffers keep their identity and change their contents, so the graph must record
    the build."""
    global _last
    if cu.is_cuda and torch.cuda.is_current_stream_capturing():
        return _build_tiles(cu, tokens_per_tile, max_tiles)
    last = _last
    if last is not None and last[0] is cu and last[1:3] == (tokens_per_tile, max_tiles):
        return last[3]
    tiles = _build_tiles(cu, tokens_per_tile, max_tiles)
    _last = (cu, tokens_per_tile, max_tiles, tiles)
    return tiles


def _build_tiles(cu: Tensor, tokens_per_tile: int, max_tiles: int) -> tuple[Tensor, Tensor]:
    per_seq = (cu[1:] - cu[:-1] + tokens_per_tile - 1) // tokens_per_tile
    offsets = torch.cat([per_seq.new_zeros(1), per_seq.cumsum(0)])
    p = torch.arange(max_tiles, device=cu.device)
    seq = (torch.searchsorted(offsets, p, right=True) - 1).clamp(max=per_seq.shape[0] - 1)
    valid = p < offsets[-1]
    tok = (p - offsets[seq]) * tokens_per_tile
    return torch.where(valid, seq, -1).to(torch.int32), tok.to(torch.int32)
