"""The shapes CUDA graphs are captured at, and the one a step takes: the decode batch-size ladder and the
(B, K, T) buckets of mixed steps (engine/worker/mixed_graphs.py explains them). Shapes alone, no torch:
the simulator asks the same questions of a batch as the GPU runner does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashstate.ops.chunking import FLA_CHUNK

if TYPE_CHECKING:
    from flashstate.engine.scheduler import ScheduledBatch

PREFILL_SIZES = (64, 128, 256, 512, 1024, 2048)  # multiples of FLA_CHUNK: a bucket's chunk count is fixed
MAX_CHUNKS = 3  # prefill chunks in one bucket
# state exports in one bucket (checkpoints the cache keeps: prompt ends, block boundaries, message ends);
# a bucket always runs this many, the unused ones writing into the pad slot
MAX_EXPORTS = 2 * MAX_CHUNKS


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_batch (vLLM's ladder, shortened)."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch + 1, 8))
    if not sizes or sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sorted(set(sizes))


def mixed_decode_sizes(max_decode: int) -> list[int]:
    """The decode-row counts of mixed-step buckets: powers of two, then max_decode. Coarser than the decode
    ladder: a mixed step's pad rows cost little beside its chunks (one token each, attending to one), and
    each size is one graph per (K, T) pair to capture at start: 96 rows take 8 sizes, 120 graphs, where the
    decode ladder's 15 sizes took 225."""
    sizes = [1 << i for i in range(max_decode.bit_length()) if 1 << i < max_decode]
    return [*sizes, max_decode]


def decode_shaped(batch: ScheduledBatch) -> bool:
    """One token per sequence, each sampling, nothing exported: what a decode graph runs (up to its size)."""
    one_each = all(n == 1 for n in batch.num_tokens)
    return not batch.exports and one_each and all(map(batch.samples, range(len(batch))))


def padded_len(n: int) -> int:
    return -(-n // FLA_CHUNK) * FLA_CHUNK


def chunk_lens(counts: list[int], t: int) -> list[int]:
    """The padded lengths of a bucket's chunks: whole FLA chunks each, the last taking the rest of T."""
    head = [padded_len(n) for n in counts[:-1]]
    return [*head, t - sum(head)]


class MixedBuckets:
    """The (B, K, T) shapes mixed steps are padded to, and the one a batch takes (shapes alone: the
    simulator asks it too)."""

    def __init__(
        self,
        block_size: int,
        max_blocks_per_seq: int,
        max_decode: int,
        prefill_sizes: tuple[int, ...] = PREFILL_SIZES,
        max_exports: int = MAX_EXPORTS,
    ):
        if any(t % FLA_CHUNK for t in prefill_sizes):
            raise ValueError(f"prefill sizes must be multiples of {FLA_CHUNK}, got {prefill_sizes}")
        self.block_size = block_size
        self.width = max_blocks_per_seq
        self.decode_sizes = mixed_decode_sizes(max_decode)
        self.max_exports = max_exports
        # a chunk longer than the widest block table never runs (nor may a capture's pad chunk address it)
        self.prefill_sizes = sorted(t for t in prefill_sizes if -(-t // block_size) <= max_blocks_per_seq)

    def keys(self) -> list[tuple[int, int, int]]:
        """Every bucket: K chunks of at least FLA_CHUNK tokens each fit in T."""
        return [
            (b, k, t)
            for b in self.decode_sizes
            for t in self.prefill_sizes
            for k in range(1, min(MAX_CHUNKS, t // FLA_CHUNK) + 1)
        ]

    def bucket(self, batch: ScheduledBatch) -> tuple[int, int, int] | None:
        """(B, K, T) of a batch with at most max_exports exports, K ≤ MAX_CHUNKS rows of more than one token
        whose padded lengths fit the largest prefill size, and at most the largest decode size of one-token
        rows; None for any other."""
        chunks = [i for i, n in enumerate(batch.num_tokens) if n > 1]
        k = len(chunks)
        if len(batch.exports) > self.max_exports or not 1 <= k <= MAX_CHUNKS:
            return None
        need = sum(padded_len(batch.num_tokens[i]) for i in chunks[:-1]) + batch.num_tokens[chunks[-1]]
        t = next((s for s in self.prefill_sizes if s >= max(need, k * FLA_CHUNK)), None)
        b = next((s for s in self.decode_sizes if s >= max(len(batch) - k, 1)), None)
        if t is None or b is None:
            return None
        lens = chunk_lens([batch.num_tokens[i] for i in chunks], t)
        for i, n in zip(chunks, lens, strict=True):
            if -(-(batch.seqs[i].num_computed_tokens + n) // self.block_size) > self.width:
                return None  # the pads would run past the widest block table
        return b, k, t
