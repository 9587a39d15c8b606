import hashlib
import random
from array import array

from flashstate.cache.host import layout as layout_module
from flashstate.cache.host.layout import HostLayout


def test_a_known_chain_grows_with_the_tokens_and_hashes_each_chunk_once(monkeypatch):
    layout = HostLayout("fp", 8)
    rng = random.Random(0)
    tokens = [rng.randrange(1000) for _ in range(30)]
    calls = []
    real = layout_module._token_bytes
    monkeypatch.setattr(layout_module, "_token_bytes", lambda t: calls.append(len(t)) or real(t))
    known: list[bytes] = []
    assert layout.chain(tokens, 17, known) == layout.chain(tokens, 17)  # two whole chunks
    assert len(known) == 3
    calls.clear()
    tokens += [rng.randrange(1000) for _ in range(10)]  # the sequence grows (its output)
    grown = layout.chain(tokens, 40, known)
    assert calls == [8, 8, 8]  # only chunks 2..4 were hashed
    assert grown == layout.chain(tokens, 40)
    assert layout.chain(tokens, 9, known) == layout.chain(tokens, 9)  # a shallower depth: a prefix of it
    assert layout.keys(tokens, 33, known) == layout.keys(tokens, 33)


def test_keys_hash_whole_chunks_in_pieces_that_keep_the_gil(monkeypatch):
    # A 1,024-token chunk is 4 KiB: hashlib would let go of the GIL for it (2 KiB or more), so it is fed in
    # pieces below that; the digest is the whole chunk's, so the keys are those of one update.
    fed = []
    real = hashlib.blake2b

    class Recording:
        def __init__(self, **kw):
            self.h = real(**kw)

        def update(self, data):
            fed.append(len(data))
            self.h.update(data)

        def digest(self):
            return self.h.digest()

    layout = HostLayout("fp", 1024)
    tokens = [random.Random(1).randrange(200_000) for _ in range(2500)]
    root = layout.salted_root(None)
    monkeypatch.setattr(layout_module.hashlib, "blake2b", Recording)
    chain = layout.chain(tokens, 2500)
    assert fed and max(fed) < 2048
    whole = real(digest_size=16)
    whole.update(root)
    whole.update(array("I", tokens[:1024]).tobytes())
    assert chain[1] == whole.digest()
