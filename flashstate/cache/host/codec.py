"""Host-tier objects: raw tensor bytes behind a small header, with a checksum and, given a deployment
secret, a MAC. Never pickle.

    | magic "FSH2" | header_len u32 | crc32 u32 | mac 32 B | header (JSON, padded to 64 B) | tensor 0 | …
header = {"key": the object's store key, "tensors": [[dtype, [shape…]], …]}; each tensor starts on a
64-byte boundary; crc32 covers everything after the first 12 bytes. mac = HMAC-SHA256(secret, len(key)
u32 | key | magic | header_len | everything after the mac), all zeros without a secret.
`check` sorts an object into usable (its tensor specs) or a reason it is not: "corrupt" (magic, checksum,
header, key or size wrong), "forged" (a secret is set and the MAC does not match: the checksum alone only
catches accidents, anyone who can write to the store can compute one), "layout" (sound, but its tensors
are not the ones the reader expects). A decoded object is the list of its tensors as views into the
buffer (no copy).
The checksum is zlib's CRC-32, computed by ISA-L (the `isal` package: ~30 GB/s a core with PCLMUL against
zlib's ~7, the same value) where it is installed, else by zlib; both release the GIL.
HMAC-SHA256 rather than keyed BLAKE2b: hashlib's SHA-256 is OpenSSL's (SHA-NI where the CPU has it),
1.6 GB/s against BLAKE2b's 0.7 GB/s on the 2-core EPYC this was measured on
(benchmarks/faults/mac_cost.py); both let go of the GIL, so objects verify in parallel.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

try:  # the same CRC-32 as zlib's, ~4x faster: objects written with either read with the other
    from isal.isal_zlib import crc32
except ImportError:  # isal is a dependency; zlib stays the fallback
    from zlib import crc32

MAGIC = b"FSH2"
_PREFIX = struct.Struct("<4sII32s")
_CRC_FROM = 12  # the checksum covers everything from here
_MAC_AT = 12
_MAC_SIZE = 32
_ALIGN = 64
Spec = tuple[torch.dtype, tuple[int, ...]]
_DTYPES = {
    str(d): d
    for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.uint8)
    + (torch.float8_e4m3fn, torch.float8_e5m2)  # --kv-cache-dtype fp8's KV
}


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
    b.seal()                   # after every copy has landed: writes the MAC (with a secret), the checksum
    """

    def __init__(
        self,
        key: str,
        specs: list[tuple[torch.dtype, tuple[int, ...]]],
        allocate: Callable[[int], torch.Tensor] | None = None,
        secret: bytes | None = None,
    ):
        self.key = key
        self._secret = secret
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
        mac = bytes(_MAC_SIZE)
        if self._secret is not None:
            mac = _mac(self._secret, self.key, self._header_len, raw)
        raw[_MAC_AT : _PREFIX.size] = mac
        crc = crc32(raw[_CRC_FROM:])
        raw[: _PREFIX.size] = _PREFIX.pack(MAGIC, self._header_len, crc, mac)
        return self.buffer


def _mac(secret: bytes, key: str, header_len: int, raw: memoryview) -> bytes:
    """HMAC-SHA256 of the object's key, magic, header length and everything after the MAC slot."""
    h = hmac.new(secret, digestmod=hashlib.sha256)
    name = key.encode()
    h.update(struct.pack("<I", len(name)) + name + MAGIC + struct.pack("<I", header_len))
    h.update(raw[_PREFIX.size :])
    return h.digest()


def object_size(key: str, specs: list[tuple[torch.dtype, tuple[int, ...]]]) -> int:
    return _layout(key, specs)[2]


def encode(key: str, tensors: list[torch.Tensor], secret: bytes | None = None) -> torch.Tensor:
    b = ObjectBuilder(key, [(t.dtype, tuple(t.shape)) for t in tensors], secret=secret)
    for dst, src in zip(b.tensors, tensors, strict=True):
        dst.copy_(src)
    return b.seal()


def check(
    key: str, buffer: torch.Tensor, expected: list[Spec] | None = None, secret: bytes | None = None
) -> tuple[list[Spec] | None, str]:
    """(the tensor specs, "ok") of a sound object stored under `key`, else (None, "corrupt" | "forged" |
    "layout") as in the module docstring. `expected`: the specs the reader needs (None: any). No torch
    calls: the checksum and the MAC release the GIL, so objects verify in parallel on threads."""
    if buffer.numel() < _PREFIX.size:
        return None, "corrupt"
    raw = memoryview(buffer.numpy())
    magic, header_len, crc, mac = _PREFIX.unpack(raw[: _PREFIX.size])
    if magic != MAGIC or _PREFIX.size + header_len > len(raw):
        return None, "corrupt"
    if secret is not None:
        if not hmac.compare_digest(mac, _mac(secret, key, header_len, raw)):
            return None, "corrupt" if crc32(raw[_CRC_FROM:]) != crc else "forged"
    elif crc32(raw[_CRC_FROM:]) != crc:
        return None, "corrupt"
    try:
        header = json.loads(bytes(raw[_PREFIX.size : _PREFIX.size + header_len]))
        specs = [(_DTYPES[d], tuple(s)) for d, s in header["tensors"]]
    except (ValueError, KeyError, TypeError):
        return None, "corrupt"
    if header.get("key") != key or _layout(key, specs)[2] != buffer.numel():
        return None, "corrupt"
    if expected is not None and specs != [(d, tuple(s)) for d, s in expected]:
        return None, "layout"
    return specs, "ok"


def verify(key: str, buffer: torch.Tensor, secret: bytes | None = None) -> list[Spec] | None:
    """The tensor specs of a sound object stored under `key`; None for anything else."""
    return check(key, buffer, secret=secret)[0]


_POOL: ThreadPoolExecutor | None = None


def verify_many(
    objects: list[tuple[str, torch.Tensor, list[Spec] | None]], secret: bytes | None = None
) -> list[tuple[list[Spec] | None, str]]:
    """`check` of each (key, buffer, expected specs), in parallel on a shared thread pool."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(min(os.cpu_count() or 1, 16), thread_name_prefix="flashstate-host-verify")
    return list(_POOL.map(lambda o: check(*o, secret=secret), objects))


def views(key: str, buffer: torch.Tensor, specs: list[Spec]) -> list[torch.Tensor]:
    """The tensors of a verified object, as views into `buffer` (no copy)."""
    _, offsets, _ = _layout(key, specs)
    return [_view(buffer, o, d, s) for o, (d, s) in zip(offsets, specs, strict=True)]


def decode(key: str, buffer: torch.Tensor, secret: bytes | None = None) -> list[torch.Tensor] | None:
    """The tensors of a sound object stored under `key`; None for anything else."""
    specs = verify(key, buffer, secret)
    return None if specs is None else views(key, buffer, specs)


def _view(buffer: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return buffer[offset : offset + nbytes(dtype, shape)].view(dtype).view(shape)
