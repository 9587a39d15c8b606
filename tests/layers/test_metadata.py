import pytest
import torch

from flashstate.layers.metadata import ForwardMetadata
from flashstate.ops.chunking import FLA_CHUNK


def test_positions_and_slots_follow_block_tables():
    meta = ForwardMetadata.build(
        query_lens=[3, 1, 2],
        context_lens=[3, 18, 7],
        block_tables=[[4], [2, 9], [5]],
        block_size=16,
        state_slots=[0, 1, 2],
        exports=[(0, 2, 7), (2, 2, 8)],
    )
    assert meta.cu_seqlens.tolist() == [0, 3, 4, 6]
    assert meta.positions.tolist() == [0, 1, 2, 17, 5, 6]
    assert meta.slot_mapping.tolist() == [64, 65, 66, 9 * 16 + 1, 85, 86]
    assert meta.block_tables.tolist() == [[4, 0], [2, 9], [5, 0]]
    assert meta.has_initial_state.tolist() == [False, True, True]
    assert meta.export_token_ids.tolist() == [1, 5] and meta.export_slots.tolist() == [7, 8]
    assert meta.context_lens.dtype == torch.int64 and not meta.is_decode
    # the fields share one upload; each starts 16-byte aligned, as a tensor of its own would
    tensors = [meta.cu_seqlens, meta.positions, meta.slot_mapping, meta.block_tables, meta.export_slots]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    assert all(t.data_ptr() % 16 == 0 and t.is_contiguous() for t in tensors)


def test_spans_are_read_on_the_host():
    """(shortest span, every span a whole prompt): what the attention ops pick their kernel by, sync-free."""
    whole = ForwardMetadata.build([300, 400], [300, 400], [[0] * 19, [1] * 25], 16, [0, 1])
    assert whole.spans == (300, True)
    resumed = ForwardMetadata.build([300, 2], [300, 40], [[0] * 19, [1] * 3], 16, [0, 1])
    assert resumed.spans == (2, False)
    assert whole.to("cpu").spans == (300, True)


def test_a_batch_without_exports_has_empty_export_fields():
    meta = ForwardMetadata.build([1], [4], [[3]], block_size=4, state_slots=[2])
    assert meta.export_token_ids.shape == (0,) and meta.export_slots.shape == (0,)
    assert meta.state_slots.tolist() == [2] and meta.block_tables.tolist() == [[3]]
    assert meta.positions.tolist() == [3] and meta.slot_mapping.tolist() == [15] and meta.is_decode


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(query_lens=[0], context_lens=[1], block_tables=[[0]]), "query_len"),
        (dict(query_lens=[2], context_lens=[1], block_tables=[[0]]), "query_len"),
        (dict(query_lens=[1], context_lens=[17], block_tables=[[0]]), "cannot hold"),
        (dict(query_lens=[1], context_lens=[1], block_tables=[[0], [1]]), "one entry per sequence"),
        (dict(query_lens=[2], context_lens=[2], block_tables=[[0]], exports=[(0, 3, 1)]), "outside its span"),
    ],
)
def test_bad_batches_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        ForwardMetadata.build(block_size=16, state_slots=[0], **kw)


def test_chunk_indices_list_each_sequences_64_token_chunks_in_order():
    """FLA's layout, built on the host: (sequence, chunk within it) for every 64-token chunk of each span."""
    meta = ForwardMetadata.build([1, 130, 64, 65], [5, 130, 64, 65], [[0], [1] * 9, [2] * 4, [3] * 5], 16,
                                 [0, 1, 2, 3])  # fmt: skip
    expected = [(i, c) for i, q in enumerate([1, 130, 64, 65]) for c in range(-(-q // FLA_CHUNK))]
    assert [tuple(r) for r in meta.chunk_indices.tolist()] == expected
    assert meta.chunk_indices.dtype == torch.int64 and meta.chunk_indices.is_contiguous()
    assert meta.token_seqs.tolist() == [0] + [1] * 130 + [2] * 64 + [3] * 65


def test_a_decode_batch_has_no_chunk_indices():
    meta = ForwardMetadata.build([1, 1], [4, 9], [[0], [1]], 16, [0, 1])
    assert meta.chunk_indices is None and meta.token_seqs is None


def test_padding_runs_extra_tokens_after_the_last_span_into_the_pad_block():
    meta = ForwardMetadata.build([1, 6], [5, 6], [[3, 4], [7, 8]], 4, [0, 1], pad=5, pad_block=99)
    assert meta.query_lens_cpu == [1, 11] and meta.cu_seqlens.tolist() == [0, 1, 12]
    assert meta.real_tokens.tolist() == [True] * 7 + [False] * 5
    assert meta.last_real.tolist() == [0, 6]
    # the pads sit at positions 6..10: the rest of block 8, then the pad block
    assert meta.slot_mapping.tolist()[7:] == [8 * 4 + 2, 8 * 4 + 3, 99 * 4, 99 * 4 + 1, 99 * 4 + 2]
    assert meta.block_tables.tolist()[1] == [7, 8, 99] and not meta.has_initial_state.tolist()[1]
    unpadded = ForwardMetadata.build([1, 6], [5, 6], [[3, 4], [7, 8]], 4, [0, 1])
    assert unpadded.real_tokens is None and unpadded.last_real is None


def test_a_pad_list_pads_after_each_span():
    meta = ForwardMetadata.build(
        [1, 3, 6], [5, 3, 6], [[3, 4], [5], [7, 8]], 4, [0, 1, 2], pad=[0, 2, 5], pad_block=99
    )
    assert meta.query_lens_cpu == [1, 5, 11] and meta.cu_seqlens.tolist() == [0, 1, 6, 17]
    assert meta.real_tokens.tolist() == [True] * 4 + [False] * 2 + [True] * 6 + [False] * 5
    assert meta.last_real.tolist() == [0, 3, 11]
    # span 1's pads: positions 3 (the rest of its block 5) and 4 (the pad block)
    assert meta.slot_mapping.tolist()[4:6] == [5 * 4 + 3, 99 * 4]
    assert meta.block_tables.tolist()[1][:2] == [5, 99]
    assert meta.chunk_indices.tolist() == [[0, 0], [1, 0], [2, 0]]


def test_padding_needs_a_pad_block():
    with pytest.raises(ValueError, match="pad block"):
        ForwardMetadata.build([2], [2], [[0]], 4, [0], pad=3)
    with pytest.raises(ValueError, match="pad block"):
        ForwardMetadata.build([2, 1], [2, 1], [[0], [1]], 4, [0, 1], pad=[1, 0])
    with pytest.raises(ValueError, match="1 pads for 2 sequences"):
        ForwardMetadata.build([2, 1], [2, 1], [[0], [1]], 4, [0, 1], pad=[1], pad_block=9)
