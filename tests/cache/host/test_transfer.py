import pytest
import torch

from flashstate.cache.host.codec import ObjectBuilder, decode, encode
from flashstate.cache.host.transfer import StateTransfer
from tests.cache.host.conftest import BLOCK, CHUNK, make_caches


def _kv(caches, blocks: list[int], tokens: int) -> list[torch.Tensor]:
    """Every attention layer's K and V of the first `tokens` positions of `blocks`."""
    return [t[torch.tensor(blocks)].flatten(0, 1)[:tokens] for pair in caches.kv for t in pair]


def _objects(caches, transfer: StateTransfer, tokens: list[int]) -> list[ObjectBuilder]:
    """One host object per piece of `tokens[i]` tokens, each in a buffer of its own."""
    return [ObjectBuilder(f"o{i}", transfer.kv_specs(n)) for i, n in enumerate(tokens)]


@pytest.mark.parametrize("group_bytes", [1, 1 << 30])
def test_kv_pieces_scatter_in_groups_of_one_copy_each(group_bytes):
    caches = make_caches(seed=4)
    transfer = StateTransfer(caches, BLOCK)
    kv = _kv(caches, list(range(6)), 22)
    spans = [(0, 8), (8, 16), (16, 22)]  # two chunks, then a tail of 6 (a block and a half)
    pieces = [decode(f"p{i}", encode(f"p{i}", [t[a:b] for t in kv])) for i, (a, b) in enumerate(spans)]
    pieces.append(decode("e", encode("e", [t[:0] for t in kv])))  # an empty tail (depth on a chunk end)
    dst = list(range(30, 36))
    transfer.scatter_pieces(dst, pieces[:3], group_bytes)
    assert all(torch.equal(a, b) for a, b in zip(_kv(caches, dst, 22), kv, strict=True))
    dst = list(range(50, 54))
    transfer.scatter_pieces(dst, [*pieces[:2], pieces[3]], group_bytes)
    assert all(torch.equal(a, b[:16]) for a, b in zip(_kv(caches, dst, 16), kv, strict=True))


@pytest.mark.parametrize("group_bytes", [1, 2048, 1 << 30])
def test_chunks_gather_from_scattered_blocks_into_their_objects(group_bytes):
    caches = make_caches(seed=5)
    transfer = StateTransfer(caches, BLOCK)
    blocks = [9, 3, 40, 41, 7, 22, 5, 60]  # four chunks of two blocks, in no order
    objects = _objects(caches, transfer, [CHUNK] * 4)
    transfer.gather_chunks(blocks, [o.buffer for o in objects], objects[0].layout, group_bytes)
    for i, obj in enumerate(objects):
        want = _kv(caches, blocks[2 * i : 2 * i + 2], CHUNK)
        assert all(torch.equal(a, b) for a, b in zip(obj.tensors, want, strict=True))
        assert decode(obj.key, obj.seal()) is not None  # the header survived the copy into the buffer


def test_chunk_pieces_laid_out_otherwise_scatter_one_by_one():
    caches = make_caches(seed=6)
    transfer = StateTransfer(caches, BLOCK)
    kv = _kv(caches, [12, 13, 30, 31], 2 * CHUNK)
    loose = [t[:CHUNK].clone() for t in kv]  # a tensor per buffer
    packed = decode("p", encode("p", [t[CHUNK:] for t in kv]))
    dst = list(range(20, 24))
    transfer.scatter_pieces(dst, [loose, packed])
    assert all(torch.equal(a, b) for a, b in zip(_kv(caches, dst, 2 * CHUNK), kv, strict=True))


def test_a_gathered_chunk_scatters_back_to_the_same_kv():
    caches = make_caches(seed=7)
    transfer = StateTransfer(caches, BLOCK)
    objects = _objects(caches, transfer, [CHUNK] * 3)
    src = [2, 8, 4, 16, 32, 1]
    transfer.gather_chunks(src, [o.buffer for o in objects], objects[0].layout)
    pieces = [decode(o.key, o.seal()) for o in objects]
    dst = list(range(44, 50))
    transfer.scatter_pieces(dst, pieces)
    assert all(
        torch.equal(a, b)
        for a, b in zip(_kv(caches, dst, 3 * CHUNK), _kv(caches, src, 3 * CHUNK), strict=True)
    )
