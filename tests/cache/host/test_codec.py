import struct
import zlib

import pytest
import torch

from flashstate.cache.host.codec import ObjectBuilder, decode, encode, object_size


def _tensors():
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(3, 4, generator=g),
        torch.randn(5, generator=g).to(torch.bfloat16),
        torch.randn(0, 2, 7, generator=g),
        torch.randn(2, 2, 2, generator=g).half(),
    ]


def test_round_trip_is_bit_exact_and_zero_copy():
    tensors = _tensors()
    buf = encode("k/1", tensors)
    assert buf.numel() == object_size("k/1", [(t.dtype, tuple(t.shape)) for t in tensors])
    out = decode("k/1", buf)
    assert out is not None and len(out) == len(tensors)
    for a, b in zip(out, tensors, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert out[0].untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()


def test_builder_fills_in_place_then_seals():
    tensors = _tensors()
    b = ObjectBuilder("k", [(t.dtype, tuple(t.shape)) for t in tensors])
    for dst, src in zip(b.tensors, tensors, strict=True):
        dst.copy_(src)
    out = decode("k", b.seal())
    assert out is not None and all(torch.equal(a, t) for a, t in zip(out, tensors, strict=True))


@pytest.mark.parametrize("where", [0, 5, 13, 100, -1])
def test_any_flipped_byte_decodes_to_none(where):
    buf = encode("k", _tensors()).clone()
    buf[where] ^= 0x40
    assert decode("k", buf) is None


def test_wrong_key_truncated_or_empty_decode_to_none():
    buf = encode("k", _tensors())
    assert decode("other", buf) is None
    assert decode("k", buf[:-64]) is None
    assert decode("k", torch.empty(0, dtype=torch.uint8)) is None


def test_the_checksum_is_zlibs_crc32_whichever_library_computes_it():
    # objects sealed with ISA-L's CRC-32 check with zlib's: stores written before the switch stay valid
    buf = encode("k/2", _tensors())
    raw = buf.numpy().tobytes()
    assert struct.unpack("<I", raw[8:12])[0] == zlib.crc32(raw[12:])
