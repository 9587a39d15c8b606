"""Host-tier objects: raw tensor bytes behind a small header, with a checksum. Never pickle.

    | magic "FSH1" | header_len u32 | crc32 u32 | header (JSON, padded to 64 B) | tensor 0 | tensor 1 | …
header = {"key": the object's store key, "tensors": [[dtype, [shape…]], …]}; each tensor starts on a
64-byte boundary; crc32 covers everything after the first 12 bytes. A decoded object is the list of
its tensors as views into the buffer (no copy); a wrong magic, checksum, key or size decodes to None.
"""

from __future__ import annotations

import functools
import json
import os
import struct
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

MAGIC = b"FSH1"
_PREFIX = struct.Struct("<4sII")
_ALIGN = 64
Spec = tuple[torch.dtype, tuple[int, ...]]
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.uint8)}


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _layout(key: str, specs: list[tuple[torch.dtype, tuple[int, ...]]]) -> tuple[bytes, list[int], int]:
    tensors = _tensors_json(tuple((d, tuple(s)) for d, s in specs))
    header = ('{"key": ' + json.dumps(key) + ', "tensors": ' + tensors + "}").encode()
    offsets, total = _offsets(len(header), tuple((d, tuple(s)) for d, s in specs))
    return header, list(offsets), total


@functools.lru_cache(maxsize=64)
def _tensors_json(specs: tuple[tuple[torch.dtype, tuple[int, ...]], ...]) -> str:
    return json.dumps([[str(d), list(s)] for d, s in specs])


@functools.lru_cache(maxsize=256)
def _offsets(
    header_len: int, specs: tuple[tuple[torch.dtype, tuple[int, ...]], ...]
) -> tuple[tuple[int, ...], int]:
    offset = _align(_PREFIX.size + header_len)
    offsets = []
    for dtype, shape in specs:
        offsets.append(offset)
        offset = _align(offset + nbytes(dtype, shape))
    return tuple(offsets), offset


def nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


class ObjectBuilder:
    """An object whose tensors are filled in place (e.g. by device → host copies), then sealed.

    b = ObjectBuilder(key, [(dtype, shape), …], allocate)
    b.tensors[i].copy_(…)      # views into b.buffer (made on first use)
    b.layout                   # [(byte offset in b.buffer, dtype, shape)] of its tensors
    b.seal()                   # after every copy has landed: writes the checksum
    """

    def __init__(
        self,
        key: str,
        specs: list[tuple[torch.dtype, tuple[int, ...]]],
        allocate: Callable[[int], torch.Tensor] | None = None,
    ):
        self.key = key
        header, offsets, total = _layout(key, specs)
        alloc = allocate or (lambda n: torch.empty(n, dtype=torch.uint8))
        self.buffer = alloc(total)
        self._header_len = len(header)
        raw = self.buffer.numpy()
        raw[_PREFIX.size : _PREFIX.size + len(header)] = np.frombuffer(header, dtype=np.uint8)
        raw[_PREFIX.size + len(header) : offsets[0] if offsets else total] = 0
        self.layout = [(o, d, s) for o, (d, s) in zip(offsets, specs, strict=True)]
        self._tensors: list[torch.Tensor] | None = None

    @property
    def tensors(self) -> list[torch.Tensor]:
        if self._tensors is None:
            self._tensors = [_view(self.buffer, o, d, s) for o, d, s in self.layout]
        return self._tensors

    @property
    def nbytes(self) -> int:
        return self.buffer.numel()

    def seal(self) -> torch.Tensor:
        raw = memoryview(self.buffer.numpy())
        crc = zlib.crc32(raw[_PREFIX.size :])
        raw[: _PREFIX.size] = _PREFIX.pack(MAGIC, self._header_len, crc)
        return self.buffer


def object_size(key: str, specs: list[tuple[torch.dtype, tuple[int, ...]]]) -> int:
    return _layout(key, specs)[2]


def encode(key: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    b = ObjectBuilder(key, [(t.dtype, tuple(t.shape)) for t in tensors])
    for dst, src in zip(b.tensors, tensors, strict=True):
        dst.copy_(src)
    return b.seal()


def verify(key: str, buffer: torch.Tensor) -> list[Spec] | None:
    """The tensor specs of a sound object stored under `key`; None for anything else. No torch calls:
    the checksum releases the GIL, so objects verify in parallel on threads."""
    if buffer.numel() < _PREFIX.size:
        return None
    raw = memoryview(buffer.numpy())
    magic, header_len, crc = _PREFIX.unpack(raw[: _PREFIX.size])
    if magic != MAGIC or zlib.crc32(raw[_PREFIX.size :]) != crc:
        return None
    try:
        header = json.loads(bytes(raw[_PREFIX.size : _PREFIX.size + header_len]))
        specs = [(_DTYPES[d], tuple(s)) for d, s in header["tensors"]]
    except (ValueError, KeyError, TypeError):
        return None
    if header.get("key") != key or _layout(key, specs)[2] != buffer.numel():
        return None
    return specs


_POOL: ThreadPoolExecutor | None = None


def verify_many(objects: list[tuple[str, torch.Tensor]]) -> list[list[Spec] | None]:
    """`verify` of each (key, buffer), in parallel on a shared thread pool."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(min(os.cpu_count() or 1, 16), thread_name_prefix="flashstate-host-verify")
    return list(_POOL.map(lambda kb: verify(*kb), objects))


def views(key: str, buffer: torch.Tensor, specs: list[Spec]) -> list[torch.Tensor]:
    """The tensors of a verified object, as views into `buffer` (no copy)."""
    _, offsets, _ = _layout(key, specs)
    return [_view(buffer, o, d, s) for o, (d, s) in zip(offsets, specs, strict=True)]


def decode(key: str, buffer: torch.Tensor) -> list[torch.Tensor] | None:
    """The tensors of a sound object stored under `key`; None for anything else."""
    specs = verify(key, buffer)
    return None if specs is None else views(key, buffer, specs)


def _view(buffer: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return buffer[offset : offset + nbytes(dtype, shape)].view(dtype).view(shape)
