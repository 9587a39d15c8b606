"""The host tier through the engine: a state restored from host memory (embedded store or a real
mooncake_master) gives the same greedy tokens and fp32 logits (1e-5) as full recompute; a master killed
mid-replay fails no request, and the tier is back in use once the master returns."""

import collections
import gc
import random
import signal
import time

import pytest
import torch

from flashstate import LLM, SamplingParams
from flashstate.cache.host.mooncake import start_master
from flashstate.models.presets import preset_dir

PARAMS = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
# 256-token chunk objects (the default is 1,024): these contexts then span shared chunks and a tail
ENGINE = dict(
    block_size=4, max_num_batched_tokens=256, prefill_cost_coefficients=(1e-5, 1e-8), host_chunk_tokens=256
)


def _capture(llm: LLM) -> dict[str, list[torch.Tensor]]:
    logits: dict[str, list[torch.Tensor]] = {}

    def hook(ids, rows):
        for rid, row in zip(ids, rows, strict=True):
            logits.setdefault(rid, []).append(row.clone())

    llm.engine.runner.on_logits = hook
    return logits


class Agents:
    """Three agents whose contexts (150-450 tokens: up to two 256-token chunks) grow every turn."""

    def __init__(self, vocab: int, seed: int = 0):
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.contexts = [self._new(150, 450) for _ in range(3)]

    def _new(self, lo: int, hi: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(self.rng.randint(lo, hi))]

    def advance(self, outputs: list[list[int]]) -> None:
        self.contexts = [c + o + self._new(1, 80) for c, o in zip(self.contexts, outputs, strict=True)]


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    llm = LLM(tiny_model_dir, enable_prefix_caching=False, block_size=4, max_num_batched_tokens=4096)
    return llm, _capture(llm)


def _check_round(cached, got, plain, prompts) -> list:
    ref_llm, want = plain
    outs, refs = cached.generate(prompts, PARAMS), ref_llm.generate(prompts, PARAMS)
    for out, ref in zip(outs, refs, strict=True):
        assert out.finish_reason == "length" and out.token_ids == ref.token_ids
        for a, b in zip(got[out.request_id], want[ref.request_id], strict=True):
            assert float((a - b).norm() / b.norm()) <= 1e-5
    cached.engine.check_integrity()
    return outs


def _drop_gpu_cache(llm: LLM) -> None:
    """Flush the write-backs, then empty the GPU-side cache: the next turn can only hit the host tier."""
    llm.engine.host.flush()
    llm.engine.reset_prefix_cache()


@pytest.mark.parametrize("backend", ["memory", "mooncake"])
def test_host_restores_equal_full_recompute(tiny_model_dir, plain, backend, request):
    extra = {"host_cache_bytes": 64 << 20}
    if backend == "mooncake":
        master = request.getfixturevalue("mooncake_master")
        extra.update(host_cache="mooncake", mooncake_master=master.address)
    cached = LLM(tiny_model_dir, **ENGINE, **extra)
    got = _capture(cached)
    agents = Agents(cached.engine.spec.vocab_size)
    host = cached.engine.host
    for turn in range(4):
        outs = _check_round(cached, got, plain, agents.contexts)
        if turn:  # every later turn resumes the previous turn's frontier from the host
            assert all(o.num_cached_tokens >= len(c) - 80 for o, c in zip(outs, agents.contexts, strict=True))
        _drop_gpu_cache(cached)
        agents.advance([o.token_ids for o in outs])
    assert host.stats.restores == 9 and host.stats.misses_corrupt == host.stats.misses_dropped == 0
    assert cached.engine.cache.stats.host_hits == 9
    cached.engine.close()


def test_rerendering_agents_restore_their_prompt_ends_from_the_host(tiny_model_dir, plain):
    """Agents re-sending their history without the replies (a chat template dropping the reasoning) resume
    one token before the previous prompt's end. Once the engine has seen them do it (turns 1 and 2, from the
    GPU tree), that state is what their requests write to the host, so after the GPU cache is emptied the
    next turn restores it, equal to full recompute."""
    cached = LLM(tiny_model_dir, **ENGINE, host_cache_bytes=64 << 20)
    got = _capture(cached)
    agents = Agents(cached.engine.spec.vocab_size, seed=3)
    before: list[list[int]] = []
    for turn in range(5):
        outs = _check_round(cached, got, plain, agents.contexts)
        if turn:
            assert [o.num_cached_tokens for o in outs] == [len(p) - 1 for p in before]
        if turn >= 2:
            _drop_gpu_cache(cached)
        before = agents.contexts
        agents.advance([[] for _ in outs])  # the replies are not re-sent
    assert cached.engine.cache.rerender_share > 0.5  # every continuation seen left its reply
    assert cached.engine.cache.stats.host_hits == 6  # turns 3 and 4
    cached.engine.close()


def test_larger_chunk_objects_restore_equal_full_recompute_in_fewer_objects(tiny_model_dir, plain):
    """--host-chunk-tokens: 102 tokens round down to 100 (25 blocks of 4); restores read ~depth / 100 chunk
    objects and give what full recompute gives."""
    cached = LLM(tiny_model_dir, **{**ENGINE, "host_chunk_tokens": 102}, host_cache_bytes=64 << 20)
    got = _capture(cached)
    agents = Agents(cached.engine.spec.vocab_size, seed=2)
    host = cached.engine.host
    assert host.layout.chunk_tokens == 100
    for _ in range(3):
        outs = _check_round(cached, got, plain, agents.contexts)
        _drop_gpu_cache(cached)
        tokens = [c + o.token_ids for c, o in zip(agents.contexts, outs, strict=True)]
        hits = [host.lookup(t, len(t)) for t in tokens]
        assert all(h is not None and len(h.chunks) == h.depth // 100 for h in hits)
        agents.advance([o.token_ids for o in outs])
    assert host.stats.restores == 6 and host.stats.misses_corrupt == host.stats.misses_dropped == 0
    cached.engine.close()


def test_mla_latent_cache_restores_from_the_host_equal_full_recompute():
    # Kimi-Linear's MLA caches one latent per token, its value a view into its key: the host objects
    # carry that memory once, and a restore rebuilds both.
    model = str(preset_dir("tiny-kimi-linear"))
    ref = LLM(model, enable_prefix_caching=False, block_size=4, max_num_batched_tokens=4096)
    plain_kimi = (ref, _capture(ref))
    cached = LLM(model, **ENGINE, host_cache_bytes=64 << 20)
    k, v = cached.engine.runner.caches.kv[0]
    assert v.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
    got = _capture(cached)
    agents = Agents(cached.engine.spec.vocab_size, seed=1)
    for turn in range(3):
        outs = _check_round(cached, got, plain_kimi, agents.contexts)
        if turn:
            assert all(o.num_cached_tokens >= len(c) - 80 for o, c in zip(outs, agents.contexts, strict=True))
        _drop_gpu_cache(cached)
        agents.advance([o.token_ids for o in outs])
    assert cached.engine.host.stats.restores == 6
    cached.engine.close()
    ref.engine.close()


def test_master_killed_mid_replay_then_restarted(tiny_model_dir, plain, tmp_path):
    master = start_master(log=str(tmp_path / "master.log"))
    port = int(master.address.rpartition(":")[2])
    cached = LLM(
        tiny_model_dir,
        **ENGINE,
        host_cache="mooncake",
        host_cache_bytes=64 << 20,
        mooncake_master=master.address,
    )
    got = _capture(cached)
    engine, host = cached.engine, cached.engine.host
    agents = Agents(engine.spec.vocab_size, seed=1)
    outs = _check_round(cached, got, plain, agents.contexts)
    _drop_gpu_cache(cached)
    agents.advance([o.token_ids for o in outs])

    # Mid-replay: the requests are running when the master dies.
    ids = [engine.add_request(c, PARAMS) for c in agents.contexts]
    finished = {}
    for _ in range(2):
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    master.process.send_signal(signal.SIGKILL)
    master.process.wait()
    while engine.has_unfinished():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    refs = plain[0].generate(agents.contexts, PARAMS)
    assert [finished[i].token_ids for i in ids] == [r.token_ids for r in refs]
    assert [finished[i].finish_reason for i in ids] == ["length"] * 3
    agents.advance([finished[i].token_ids for i in ids])

    # The engine keeps serving on the GPU cache alone; the outage is noticed and counted once.
    for _ in range(2):
        outs = _check_round(cached, got, plain, agents.contexts)
        assert all(o.num_cached_tokens > 0 for o in outs)  # GPU hits
        host.flush()
        agents.advance([o.token_ids for o in outs])
    assert not host.available and host.stats.outages == 1

    # The master returns (same port): the tier reconnects and serves restores again.
    master = start_master(port, log=str(tmp_path / "master2.log"))
    try:
        for _ in range(3000):
            if host.available:
                break
            time.sleep(0.01)
        assert host.available and host.stats.reconnects == 1
        # Written back to the new master: the client's first puts after a restart may still fail while it
        # reconnects (skipped write-backs, not errors), so rounds go on until one round's 3 states land.
        for _ in range(20):
            written = host.stats.states_written
            outs = _check_round(cached, got, plain, agents.contexts)
            host.flush()
            agents.advance([o.token_ids for o in outs])
            if host.stats.states_written == written + 3:
                break
        restores = host.stats.restores
        _drop_gpu_cache(cached)
        outs = _check_round(cached, got, plain, agents.contexts)
        assert host.stats.restores == restores + 3
        assert host.stats.outages == 1
        engine.close()
    finally:
        master.stop()


def test_a_host_state_deeper_than_the_gpu_hit_wins(tiny_model_dir, plain):
    cached = LLM(tiny_model_dir, **ENGINE, host_cache_bytes=64 << 20)
    got = _capture(cached)
    engine = cached.engine
    agents = Agents(engine.spec.vocab_size, seed=2)
    contexts = []
    for _ in range(2):
        outs = _check_round(cached, got, plain, agents.contexts)
        contexts.append([list(o.prompt_token_ids) + o.token_ids[:-1] for o in outs])
        agents.advance([o.token_ids for o in outs])
    engine.host.flush()
    for frontier in contexts[-1]:  # the GPU cache loses the newest frontiers, keeps the older ones
        node = engine.cache.tree.match(frontier).node
        assert node.end == len(frontier) and node.slot is not None
        engine.cache._evict(node, "test")  # noqa: SLF001
    gpu = [engine.cache.tree.match(c, len(c) - 1).depth for c in agents.contexts]
    outs = _check_round(cached, got, plain, agents.contexts)
    assert [o.num_cached_tokens for o in outs] == [len(f) for f in contexts[-1]]
    assert all(0 < g < len(f) for g, f in zip(gpu, contexts[-1], strict=True))  # a shallower GPU hit
    assert engine.host.stats.restores == 3
    engine.close()


def test_master_down_at_start_up_then_joined(tiny_model_dir, plain, tmp_path):
    from flashstate.cache.host.mooncake import free_port

    port = free_port()
    cached = LLM(
        tiny_model_dir,
        **ENGINE,
        host_cache="mooncake",
        host_cache_bytes=64 << 20,
        mooncake_master=f"127.0.0.1:{port}",
    )
    got = _capture(cached)
    engine, host = cached.engine, cached.engine.host
    host.retry_seconds = 0.1
    assert not host.available and host.stats.outages == 1 and host.stats.reconnects == 0
    agents = Agents(engine.spec.vocab_size, seed=3)
    outs = _check_round(cached, got, plain, agents.contexts)  # served on the GPU cache alone
    host.flush()
    assert host.stats.states_written == 0 and host.stats.writes_skipped == 3
    agents.advance([o.token_ids for o in outs])

    master = start_master(port, log=str(tmp_path / "master.log"))
    try:
        for _ in range(3000):
            if host.available:
                break
            time.sleep(0.01)
        assert host.available and host.stats.reconnects == 1
        outs = _check_round(cached, got, plain, agents.contexts)
        assert host.stats.states_written == 3
        _drop_gpu_cache(cached)
        agents.advance([o.token_ids for o in outs])
        _check_round(cached, got, plain, agents.contexts)
        assert host.stats.restores == 3 and host.stats.outages == 1
        engine.close()
    finally:
        master.stop()


def test_host_restores_leave_no_cyclic_garbage(tiny_model_dir):
    """A restore is freed by refcounting alone: the collector, which pauses the engine, never has to find
    its fetched objects (thousands of tensor views per restore at serving sizes)."""
    llm = LLM(tiny_model_dir, **ENGINE, host_cache_bytes=64 << 20)
    agents = Agents(llm.engine.spec.vocab_size, seed=3)
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            outs = llm.generate(agents.contexts, PARAMS)
            _drop_gpu_cache(llm)
            agents.advance([o.token_ids for o in outs])
        del outs
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection would free stays in gc.garbage
        gc.collect()
        garbage = collections.Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert llm.engine.host.stats.restores == 6
    assert garbage["Tensor"] == garbage["HostRestore"] == garbage["Future"] == 0, garbage
    llm.engine.close()


@pytest.mark.parametrize("inline", [False, True])
def test_an_inline_fetch_runs_a_restored_request_in_the_step_that_admits_it(tiny_model_dir, plain, inline):
    """--host-inline-fetch: the in-process store's restore is read at admission and the request gets its first
    token from that very step (a background fetch joins a step later); outputs equal full recompute. No
    read-ahead: one still running at admission would join a later step too."""
    llm = LLM(
        tiny_model_dir, **ENGINE, host_cache_bytes=64 << 20, host_inline_fetch=inline, host_prefetch=False
    )
    got = _capture(llm)
    agents = Agents(llm.engine.spec.vocab_size, seed=4)
    outs = _check_round(llm, got, plain, agents.contexts)
    _drop_gpu_cache(llm)
    agents.advance([o.token_ids for o in outs])
    engine = llm.engine
    rid = engine.add_request(agents.contexts[0], PARAMS)
    steps = 1
    while not any(o.request_id == rid and o.token_ids for o in engine.step()):
        steps += 1
    assert engine.host.stats.restores == 1
    assert steps == 1 if inline else steps >= 2
    while engine.has_unfinished():
        engine.step()
    _check_round(llm, got, plain, agents.contexts)  # the other two restore as well
    assert engine.host.stats.restores >= 3
    engine.close()


@pytest.mark.parametrize("prefetch", [False, True])
def test_queued_requests_have_their_host_hits_read_ahead(tiny_model_dir, plain, prefetch):
    """--host-prefetch: a queued request's host hit is read and verified in the background while it waits,
    and the step that admits it takes the objects over (outputs equal full recompute); a request aborted
    while queued has its read dropped, and no state stays pinned."""
    llm = LLM(tiny_model_dir, **ENGINE, host_cache_bytes=64 << 20, host_prefetch=prefetch)
    got = _capture(llm)
    agents = Agents(llm.engine.spec.vocab_size, seed=6)
    outs = _check_round(llm, got, plain, agents.contexts)
    _drop_gpu_cache(llm)
    agents.advance([o.token_ids for o in outs])
    engine, host = llm.engine, llm.engine.host
    engine.abort(engine.add_request(agents.contexts[0], PARAMS))  # queued, never admitted
    _check_round(llm, got, plain, agents.contexts)
    assert host.stats.restores == 3
    # a read the fetch threads had not begun by admission is dropped and read inline: how many were taken
    # over depends on the threads' timing (tests/cache/host/test_tier.py takes both paths in turn)
    assert host.stats.prefetches == (4 if prefetch else 0) and host.stats.prefetches_used <= 3
    deadline = time.monotonic() + 10  # a dropped read that was running unpins in its done callback
    while any(s.pins for s in host.index.states.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(s.pins for s in host.index.states.values())
    engine.check_integrity()
    engine.close()


def test_a_corrupt_object_found_by_an_inline_fetch_falls_back_to_recompute(tiny_model_dir, plain):
    llm = LLM(tiny_model_dir, **ENGINE, host_cache_bytes=64 << 20)
    assert llm.engine.config.host_inline
    got = _capture(llm)
    agents = Agents(llm.engine.spec.vocab_size, seed=5)
    outs = _check_round(llm, got, plain, agents.contexts)
    _drop_gpu_cache(llm)
    agents.advance([o.token_ids for o in outs])
    host = llm.engine.host
    hit = host.lookup(agents.contexts[0], len(agents.contexts[0]) - 1)
    bad = host.store.get(hit.key).clone()
    bad[-1] ^= 1
    host.store.remove(hit.key)
    assert host.store.put(hit.key, bad)
    outs = _check_round(llm, got, plain, agents.contexts)  # the first recomputed, the other two restored
    assert host.stats.misses_corrupt == 1 and host.stats.restores == 2
    assert outs[0].num_cached_tokens == 0
    llm.engine.close()


def test_a_session_back_from_the_host_is_admitted_beside_a_runner_as_a_cached_one(tiny_model_dir, plain):
    """Memory admission holds a mostly-uncached prompt to the cold reserve while anything runs. A prompt
    whose prefix only the host tier holds is a session coming back: it restores and prefills its tail beside
    a long runner, as a GPU hit would, instead of waiting for the runner to finish."""
    # 8 MiB: 2,272 blocks of 4 tokens; a cold prompt may grow the running set into 5% of them (113)
    cached = LLM(
        tiny_model_dir, **ENGINE, host_cache_bytes=64 << 20, kv_cache_memory_bytes=8 << 20,
        admission_cold_reserve=0.95,
    )  # fmt: skip
    got = _capture(cached)
    engine = cached.engine
    agents = Agents(engine.spec.vocab_size, seed=4)
    outs = _check_round(cached, got, plain, agents.contexts[:1])
    _drop_gpu_cache(cached)
    agents.advance([o.token_ids for o in outs] + [[], []])
    back = agents.contexts[0]
    runner = engine.add_request(agents._new(400, 400), SamplingParams(max_tokens=200, ignore_eos=True))
    engine.step()
    assert engine.cache.tree.match(back, len(back) - 1).depth == 0  # only the host holds its prefix
    # 400 + 200 tokens: 150 blocks running; `back` (≤ 535 + 5 tokens) adds ≤ 135, within 75% of 2,272
    rid = engine.add_request(back, PARAMS)
    finished: dict[str, int] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = len(finished)
    assert finished[rid] < finished[runner]
    assert engine.cache.stats.host_hits == 1 and engine.cache.stats.cached_tokens >= len(back) - 80
    engine.check_integrity()
    engine.close()
