import random

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
