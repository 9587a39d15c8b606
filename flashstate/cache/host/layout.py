"""Host-tier keys: KV in content-addressed chunks chained by prefix hash, checkpoints keyed by (prefix
hash, position), everything under the model fingerprint.

    tokens  | chunk 0 | chunk 1 | … | chunk j-1 | tail |        (C = chunk_tokens, a multiple of the block)
    h_0 = H(fingerprint),  h_{i+1} = H(h_i, tokens of chunk i)
    (a request with a cache salt starts from h_0 = H(H(fingerprint), "salt", salt) instead)
    KV object of chunk i:     {prefix}/kv/{h_{i+1}}      every attention layer's K, V of its C tokens
    state object at depth p:  {prefix}/state/{H(h_j, tail, p)},  j = floor(p / C)
                              every linear layer's conv + recurrent state after token p - 1, and the
                              attention K, V of the tail tokens [jC, p)
A state at depth p restores from chunks 1..j and its state object. Equal prefixes give equal keys, so
a request writes only the chunks (and state) the store lacks; every key descends from h_0, so requests of
different cache salts never share an object (salt None: the unsalted keys).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from array import array

import torch

from flashstate.models.fingerprint import layout_fingerprint
from flashstate.spec.model_spec import ModelSpec

# hashlib lets go of the GIL for an update of 2 KiB or more, and the engine thread then waits behind the
# server's threads to take it back (up to a switch interval each: 2.9% of its time on the H200): a part is fed
# in pieces below that. The digest is the whole part's, so keys do not change with the piece size.
HASH_PIECE_BYTES = 1024


def _h(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        view = memoryview(p)
        for i in range(0, len(view), HASH_PIECE_BYTES):
            h.update(view[i : i + HASH_PIECE_BYTES])
    return h.digest()


@functools.lru_cache(maxsize=1024)
def _salted(root: bytes, salt: str) -> bytes:
    return _h(root, b"salt", salt.encode())


def _token_bytes(tokens: list[int]) -> bytes:
    return array("I", tokens).tobytes()  # 4 bytes a token: a 1,024-token chunk is 4 KiB, hashed in pieces


def weights_fingerprint(model: torch.nn.Module, sample: int = 4096) -> str:
    """Every parameter's name, shape and dtype, and a strided sample of its values."""
    h = hashlib.blake2b(digest_size=8)
    for name, p in sorted(model.state_dict().items()):
        flat = p.detach().reshape(-1)
        step = max(flat.numel() // sample, 1)
        values = flat[::step][:sample].float().cpu()
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        h.update(values.numpy().tobytes())
    return h.hexdigest()


def model_fingerprint(
    model: torch.nn.Module,
    spec: ModelSpec,
    dtype: torch.dtype,
    block_size: int,
    chunk_tokens: int,
    cache_shapes: list | None = None,
) -> str:
    """Weights, layer layout, dtype, block and chunk size, and the cache tensors' dtypes and shapes per token
    (e.g. MLA's latent, an fp8 KV cache): a state never restores into another model or another cache layout
    (a server restarted with another --kv-cache-dtype misses)."""
    layout = layout_fingerprint(
        spec, dtype, block_size=block_size, chunk_tokens=chunk_tokens, cache_shapes=cache_shapes or []
    )
    return f"{layout}-{weights_fingerprint(model)}"


class HostLayout:
    def __init__(self, fingerprint: str, chunk_tokens: int):
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        self.fingerprint = fingerprint
        self.chunk_tokens = chunk_tokens
        self.prefix = f"flashstate/{fingerprint}"
        self.root = _h(fingerprint.encode())

    def salted_root(self, salt: str | None) -> bytes:
        """h_0 of a request with cache salt `salt` (None: unsalted)."""
        return self.root if salt is None else _salted(self.root, salt)

    def chain(
        self, tokens: list[int], depth: int, known: list[bytes] | None = None, salt: str | None = None
    ) -> list[bytes]:
        """[h_0, h_1, …, h_j] for the j = floor(depth / C) full chunks of tokens[:depth]. `known`: the chain
        hashed so far for this token list (which only grows) and salt, extended in place; no chunk is hashed
        twice (a `known` of another salt is started over)."""
        c = self.chunk_tokens
        root = self.salted_root(salt)
        hashes = known if known is not None else []
        if hashes and hashes[0] != root:
            hashes.clear()
        if not hashes:
            hashes.append(root)
        for i in range(len(hashes) - 1, depth // c):
            hashes.append(_h(hashes[-1], _token_bytes(tokens[i * c : (i + 1) * c])))
        return hashes[: depth // c + 1]

    def keys(
        self, tokens: list[int], depth: int, known: list[bytes] | None = None, salt: str | None = None
    ) -> tuple[bytes, str, list[str]]:
        """The state of tokens[:depth]: the chain hash of its last whole chunk, its state key, and the keys
        of its whole chunks (the state object holds the tokens past them)."""
        hashes = self.chain(tokens, depth, known, salt)
        return hashes[-1], self.state_key(hashes[-1], tokens, depth), [self.chunk_key(h) for h in hashes[1:]]

    def chunk_key(self, h: bytes) -> str:
        return f"{self.prefix}/kv/{h.hex()}"

    def state_key(self, base: bytes, tokens: list[int], depth: int) -> str:
        start = depth // self.chunk_tokens * self.chunk_tokens
        h = _h(base, _token_bytes(tokens[start:depth]), struct.pack("<q", depth))
        return f"{self.prefix}/state/{h.hex()}"
