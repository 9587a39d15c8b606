"""Restores from the host tier run in the background: while a slow fetch (a store whose reads wait on a
gate the test opens) is pending, the restoring request holds its slot and blocks and the other requests
keep stepping; the restored outputs equal full recompute; an abort mid-restore releases everything; a
corrupt object found by the fetch falls back to recompute, exactly; KV the GPU cache still holds is
shared, only the rest is restored."""

import random
import threading

import pytest

from flashstate import LLM, SamplingParams
from flashstate.sequence import SequenceStatus

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
# an explicit budget: on a GPU the automatic one would give the first engine of the module 90% of it;
# 256-token host chunks (the default is 1,024), so these prompts span shared chunks; the in-process store's
# fetch in the background, as Mooncake's (by default it is read inline at admission)
ENGINE = dict(
    block_size=4,
    max_num_batched_tokens=256,
    prefill_cost_coefficients=(1e-5, 1e-8),
    kv_cache_memory_bytes=512 << 20,
    host_chunk_tokens=256,
    host_inline_fetch=False,
)


class GatedStore:
    """A host store whose reads wait until `gate` is set: a fetch as slow as the test wants."""

    def __init__(self, inner):
        self.inner = inner
        self.gate = threading.Event()
        self.reads = 0

    def get(self, key):
        self.reads += 1
        assert self.gate.wait(60), "the test never opened the gate"
        return self.inner.get(key)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    return LLM(
        tiny_model_dir,
        enable_prefix_caching=False,
        block_size=4,
        max_num_batched_tokens=4096,
        kv_cache_memory_bytes=512 << 20,
    )


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def _engine(tiny_model_dir, request, backend: str = "memory") -> LLM:
    extra = {"host_cache_bytes": 64 << 20}
    if backend == "mooncake":
        master = request.getfixturevalue("mooncake_master")
        extra.update(host_cache="mooncake", mooncake_master=master.address)
    return LLM(tiny_model_dir, **ENGINE, **extra)


def _only_on_host(llm: LLM, prompt: list[int]) -> list[int]:
    """Serve `prompt`, write its state back, empty the GPU cache: returns the next turn's prompt."""
    out = llm.generate([prompt], PARAMS)[0]
    llm.engine.host.flush()
    llm.engine.reset_prefix_cache()
    return prompt + out.token_ids + [7, 8, 9]


def _run(engine, ids: list[str], on_step=None) -> dict:
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
        engine.check_integrity()
        if on_step is not None:
            on_step()
    return {i: done[i] for i in ids if i in done}


def test_a_restore_overlaps_the_other_requests_steps(tiny_model_dir, plain, request):
    llm = _engine(tiny_model_dir, request)
    engine = llm.engine
    rng = random.Random(0)
    vocab = engine.spec.vocab_size
    resumed = _only_on_host(llm, _tokens(rng, 300, vocab))
    other = _tokens(rng, 200, vocab)
    store = engine.host.store = GatedStore(engine.host.store)

    a = engine.add_request(resumed, PARAMS)
    b = engine.add_request(other, PARAMS)
    seq_a, seq_b = engine.requests[a].seq, engine.requests[b].seq
    progress = []
    for _ in range(4):  # the fetch of `a` is held up: `b` prefills and decodes meanwhile
        engine.step()
        engine.check_integrity()
        assert seq_a.status is SequenceStatus.RESTORING and seq_a.num_computed_tokens == 0
        assert seq_a.state_slot is not None and len(seq_a.block_table) == -(-(len(resumed) - 3) // 4)
        progress.append(seq_b.num_computed_tokens)
    assert store.reads >= 1 and progress[0] > 0 and progress == sorted(set(progress))
    assert len(seq_b.output_token_ids) >= 2
    store.gate.set()
    outs = _run(engine, [a, b])
    refs = plain.generate([resumed, other], PARAMS)
    assert [outs[a].token_ids, outs[b].token_ids] == [r.token_ids for r in refs]
    assert outs[a].num_cached_tokens == len(resumed) - 4  # the previous turn's frontier, from the host
    assert engine.host.stats.restores == 1 and engine.cache.stats.host_hits == 1
    engine.close()


def test_an_abort_mid_restore_releases_everything(tiny_model_dir, plain, request):
    llm = _engine(tiny_model_dir, request)
    engine = llm.engine
    rng = random.Random(1)
    resumed = _only_on_host(llm, _tokens(rng, 300, engine.spec.vocab_size))
    store = engine.host.store = GatedStore(engine.host.store)
    free_blocks, free_slots = engine.cache.block_pool.num_free, engine.cache.state_pool.num_free

    a = engine.add_request(resumed, PARAMS)
    engine.step()
    assert engine.requests[a].seq.status is SequenceStatus.RESTORING
    assert engine.cache.block_pool.num_free < free_blocks
    out = engine.abort(a)
    assert out.finished and out.finish_reason == "abort"
    engine.check_integrity()
    assert not engine.has_unfinished()
    assert engine.cache.block_pool.num_free == free_blocks
    assert engine.cache.state_pool.num_free == free_slots
    store.gate.set()
    engine.host.flush()  # the abandoned fetch finishes on its own; nothing lands anywhere
    assert engine.host.stats.restores == 0
    # The state is still on the host: the same prompt restores it and decodes exactly.
    out = llm.generate([resumed], PARAMS)[0]
    assert out.token_ids == plain.generate([resumed], PARAMS)[0].token_ids
    assert out.num_cached_tokens == len(resumed) - 4 and engine.host.stats.restores == 1
    engine.check_integrity()
    engine.close()


@pytest.mark.parametrize("backend", ["memory", "mooncake"])
def test_a_corrupt_object_found_by_the_fetch_falls_back_to_recompute(tiny_model_dir, plain, request, backend):
    llm = _engine(tiny_model_dir, request, backend)
    engine = llm.engine
    rng = random.Random(2)
    resumed = _only_on_host(llm, _tokens(rng, 300, engine.spec.vocab_size))
    inner = engine.host.store
    store = engine.host.store = GatedStore(inner)

    a = engine.add_request(resumed, PARAMS)
    engine.step()
    seq = engine.requests[a].seq
    assert seq.status is SequenceStatus.RESTORING
    key = seq.restore.hit.key  # the state object goes bad while the fetch is under way
    bad = inner.get(key).clone()
    bad[-1] ^= 1
    inner.remove(key)
    assert inner.put(key, bad)
    store.gate.set()
    outs = _run(engine, [a])
    assert outs[a].token_ids == plain.generate([resumed], PARAMS)[0].token_ids
    assert outs[a].num_cached_tokens == 0  # recomputed: the GPU cache was empty
    s = engine.host.stats
    assert s.misses_corrupt == 1 and s.restores == 0 and engine.cache.stats.host_hits == 0
    engine.close()


def test_only_the_kv_the_gpu_cache_lacks_is_restored(tiny_model_dir, plain, request):
    llm = _engine(tiny_model_dir, request)
    engine = llm.engine
    rng = random.Random(3)
    vocab = engine.spec.vocab_size
    shared = _tokens(rng, 300, vocab)  # a 256-token chunk and then some, common to both requests
    x, y = shared + _tokens(rng, 40, vocab), shared + _tokens(rng, 40, vocab)
    outs = llm.generate([x, y], PARAMS)
    engine.host.flush()
    frontier = x + outs[0].token_ids[:-1]
    node = engine.cache.tree.match(frontier).node
    assert node.end == len(frontier) and node.slot is not None
    engine.cache._evict(node, "test")  # noqa: SLF001 — x's state leaves the GPU, the shared KV stays
    resumed = x + outs[0].token_ids + [5, 6]
    # and so do the fallback checkpoints before it (issue 31: a state just before the prompt's end)
    while (match := engine.cache.tree.match(resumed, len(resumed) - 1)).depth > 0:
        engine.cache._evict(match.node, "test")  # noqa: SLF001
    assert match.kv_depth >= 256

    store = engine.host.store = GatedStore(engine.host.store)
    store.gate.set()
    out = llm.generate([resumed], PARAMS)[0]
    assert out.token_ids == plain.generate([resumed], PARAMS)[0].token_ids
    assert out.num_cached_tokens == len(frontier)
    s = engine.host.stats
    assert s.restores == 1 and s.shared_tokens == 256
    assert store.reads == 1  # the state object alone: the first chunk's KV was on the GPU
    engine.check_integrity()
    engine.close()


def test_an_engine_restores_a_state_another_engine_wrote_to_a_shared_store(
    tiny_model_dir, plain, mooncake_master
):
    extra = dict(host_cache="mooncake", host_cache_bytes=64 << 20, mooncake_master=mooncake_master.address)
    writer, reader = LLM(tiny_model_dir, **ENGINE, **extra), LLM(tiny_model_dir, **ENGINE, **extra)
    rng = random.Random(4)
    vocab = writer.engine.spec.vocab_size
    first = [_tokens(rng, n, vocab) for n in (300, 520)]  # the second state's tail is past a chunk end
    outs = writer.generate(first, PARAMS)
    writer.engine.host.flush()
    resumed = [p + o.token_ids + _tokens(rng, 30, vocab) for p, o in zip(first, outs, strict=True)]
    unknown = _tokens(rng, 300, vocab)

    got = reader.generate([*resumed, unknown], PARAMS)
    refs = plain.generate([*resumed, unknown], PARAMS)
    assert [g.token_ids for g in got] == [r.token_ids for r in refs]
    # The reader never wrote these states: it found the writer's, at their exact depths, in the store.
    assert [g.num_cached_tokens for g in got] == [len(p) + PARAMS.max_tokens - 1 for p in first] + [0]
    s = reader.engine.host.stats
    assert s.remote_hits == 2 and s.restores == 2 and s.misses_dropped == s.misses_corrupt == 0
    reader.engine.check_integrity()
    writer.engine.close()
    reader.engine.close()


def test_a_store_lost_during_the_fetch_falls_back_to_recompute(tiny_model_dir, plain, request):
    from flashstate.cache.host.store import StoreUnavailableError

    llm = _engine(tiny_model_dir, request)
    engine = llm.engine
    rng = random.Random(5)
    resumed = _only_on_host(llm, _tokens(rng, 300, engine.spec.vocab_size))

    class Lost(GatedStore):
        def get(self, key):
            super().get(key)
            raise StoreUnavailableError("master gone")

        def ping(self):
            return False

    store = engine.host.store = Lost(engine.host.store)
    a = engine.add_request(resumed, PARAMS)
    engine.step()
    assert engine.requests[a].seq.status is SequenceStatus.RESTORING
    store.gate.set()
    outs = _run(engine, [a])
    assert outs[a].token_ids == plain.generate([resumed], PARAMS)[0].token_ids
    assert outs[a].num_cached_tokens == 0
    assert not engine.host.available and engine.host.stats.outages == 1 and engine.host.stats.restores == 0
    engine.close()


def test_a_state_being_restored_is_not_evicted_by_a_write_back(tiny_model_dir, plain, request):
    """An in-process store hands an evicted object's bytes to the next write-back at once, so a restore pins
    its state in the index until its copies have landed. Here another request's state, worth more, could
    only be written by evicting the one being fetched: it is refused instead."""
    llm = _engine(tiny_model_dir, request)
    engine = llm.engine
    rng = random.Random(3)
    vocab = engine.spec.vocab_size
    resumed = _only_on_host(llm, _tokens(rng, 300, vocab))
    index = engine.host.index
    (held,) = index.states.values()
    chunk = next(iter(index.chunks.values())).nbytes
    other = _tokens(rng, 1000, vocab)  # its state: 3 chunks of its own and a state object
    index.capacity = index.used + held.nbytes + 3 * chunk - 1  # fits alone, not beside `held`
    store = engine.host.store = GatedStore(engine.host.store)
    a = engine.add_request(resumed, PARAMS)
    b = engine.add_request(other, PARAMS)
    seq_a = engine.requests[a].seq
    done = {}
    while b not in done:  # `b` runs to its end, and writes back, while the fetch of `a` is held up
        done.update({o.request_id: o for o in engine.step() if o.finished})
        assert seq_a.status is SequenceStatus.RESTORING
    assert held.key in index.states and engine.host.stats.writes_refused == 1
    store.gate.set()
    outs = _run(engine, [a])
    assert outs[a].token_ids == plain.generate([resumed], PARAMS)[0].token_ids
    assert engine.host.stats.restores == 1 and engine.cache.stats.host_hits == 1
    engine.close()
