"""Mixed steps run padded to fixed shapes (`--mixed-step-graphs`; on the CPU the padded forward runs eagerly,
on CUDA it is a captured graph) give requests what the unpadded engine gives them: the same tokens, text
and finish reasons, the same cache decisions, every block and slot back."""

from __future__ import annotations

import pytest
import torch

from flashstate.engine.scheduler import ScheduledBatch
from flashstate.engine.step_shapes import MAX_EXPORTS
from flashstate.engine.worker.mixed_graphs import MixedGraphs
from flashstate.sampling_params import SamplingParams
from flashstate.sequence import Sequence
from tests.engine.test_async_scheduling import _assert_pools_full, _assert_same, _engine, _requests, _summary


@pytest.mark.parametrize("policy", ["flashstate", "vllm"])
def test_outputs_equal_the_unpadded_engine(tiny_model_dir, policy):
    results, padded, hits = {}, {}, {}
    for mode in (False, True):
        llm = _engine(tiny_model_dir, True, cache_policy=policy, mixed_step_graphs=mode, max_model_len=512)
        reqs = [(list(range(100, 170)) + p, sp) for p, sp in _requests(llm.engine.spec.vocab_size, 12)]
        calls = []
        mixed = llm.engine.runner.mixed
        assert (mixed is not None) == mode
        if mixed is not None:
            forward = mixed.forward
            mixed.forward = lambda *a, _f=forward, _c=calls: _c.append((a[1], len(a[0].exports))) or _f(*a)
        first = llm.generate([p for p, _ in reqs], [s for _, s in reqs])
        turns = [p + o.token_ids + [7, 8, 9] for (p, _), o in zip(reqs, first, strict=True)]
        results[mode] = [_summary(first), _summary(llm.generate(turns, [s for _, s in reqs]))]
        padded[mode] = calls
        hits[mode] = llm.engine.cache.stats.cached_tokens
        _assert_pools_full(llm)
    assert len(padded[True]) > 10 and {k for (_, k, _), _ in padded[True]} >= {1, 2}  # one chunk and two
    assert any(n for _, n in padded[True])  # steps that export checkpoints (prompt ends, block boundaries)
    assert hits[True] == hits[False]
    for got, want in zip(results[True], results[False], strict=True):
        _assert_same(got, want)


def _seq(i: int, prompt: int, computed: int, blocks: int) -> Sequence:
    seq = Sequence(f"r{i}", list(range(1, prompt + 1)), SamplingParams())
    seq.num_computed_tokens, seq.block_table, seq.state_slot = computed, list(range(blocks)), i
    return seq


def test_a_batch_with_a_few_short_chunks_and_exports_has_a_bucket(tiny_model_dir):
    llm = _engine(tiny_model_dir, True)
    graphs = MixedGraphs(llm.engine.model, llm.engine.runner.caches, 16, 16, llm.engine.device, max_decode=12)
    decode = [_seq(i, 20, 20, 2) for i in range(3)]
    chunk = _seq(3, 100, 30, 7)
    assert graphs.bucket(ScheduledBatch([*decode, chunk], [1, 1, 1, 70])) == (4, 1, 128)
    assert graphs.bucket(ScheduledBatch([chunk], [64])) == (1, 1, 64)  # a pad row keeps the kernels' shapes
    assert graphs.bucket(ScheduledBatch(decode, [1, 1, 1])) is None  # a decode step: the decode graphs'
    # several chunks: each padded to whole 64-token chunks but the last, which fills T
    assert graphs.bucket(ScheduledBatch([chunk, _seq(4, 50, 0, 4)], [5, 6])) == (1, 2, 128)
    assert graphs.bucket(ScheduledBatch([chunk, _seq(4, 50, 0, 4)], [65, 6])) == (1, 2, 256)
    three = [_seq(4 + i, 20, 0, 2) for i in range(3)]
    assert graphs.bucket(ScheduledBatch([*decode, *three], [1, 1, 1, 2, 2, 2])) == (4, 3, 256)
    four = [_seq(4 + i, 20, 0, 2) for i in range(4)]
    assert graphs.bucket(ScheduledBatch(four, [2, 2, 2, 2])) is None  # more than MAX_CHUNKS
    assert graphs.bucket(ScheduledBatch([_seq(5, 9000, 0, 8)], [3000])) is None  # longer than 2048
    assert graphs.bucket(ScheduledBatch([_seq(6, 300, 200, 16)], [60])) is None  # pads past the widest table
    exporting = ScheduledBatch()
    exporting.add(chunk, 70, [(30, 9), (70, 10)])  # checkpoints inside the chunk and at its end
    assert graphs.bucket(exporting) == (1, 1, 128)
    for i in range(MAX_EXPORTS):  # decode rows exporting too
        exporting.add(_seq(10 + i, 100, 30, 7), 1, [(1, 20 + i)])
    assert len(exporting.exports) > MAX_EXPORTS and graphs.bucket(exporting) is None  # more than it holds


def test_every_bucket_fits_the_widest_block_table(tiny_model_dir):
    """A short max_model_len (512: 32 blocks of 16) leaves out the buckets whose chunks could not run; the
    rest build their capture buffers (what a CUDA capture does first) with pad chunks inside the table."""
    llm = _engine(tiny_model_dir, True)
    graphs = MixedGraphs(llm.engine.model, llm.engine.runner.caches, 16, 32, llm.engine.device, max_decode=12)
    assert graphs.prefill_sizes == [64, 128, 256, 512]
    for key in graphs.keys():  # noqa: SIM118 (a list of buckets, not a mapping)
        entry = graphs._entry(key)
        assert entry.meta.block_tables.shape == (key[0] + key[1], 32)
        assert int(entry.meta.context_lens.max()) <= 32 * 16
    assert graphs.bucket(ScheduledBatch([_seq(0, 900, 0, 40)], [600])) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_mixed_steps_give_the_unpadded_engines_tokens(tiny_model_dir):
    """On CUDA the buckets are captured graphs. GEMMs of another shape may round differently, so greedy runs
    can part after many tokens: every first token (sampled in a mixed step) must match, and nearly all
    whole outputs."""
    prompts = [[(7 * i + j) % 1900 + 50 for i in range(30 + 23 * j)] for j in range(10)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs, used = {}, {}
    for mode in (False, True):
        llm = _engine(tiny_model_dir, True, device="cuda", mixed_step_graphs=mode, max_model_len=1024)
        mixed = llm.engine.runner.mixed
        calls = []
        if mode:
            assert mixed is not None and all(e.graph is not None for e in mixed._buckets.values())
            forward = mixed.forward
            mixed.forward = lambda *a, _f=forward, _c=calls: _c.append(a[1]) or _f(*a)
        outs[mode] = [o.token_ids for o in llm.generate(prompts, params)]
        used[mode] = len(calls)
        _assert_pools_full(llm)
    assert used[True] >= 5
    assert [o[0] for o in outs[True]] == [o[0] for o in outs[False]]
    assert sum(a == b for a, b in zip(outs[True], outs[False], strict=True)) >= 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("preset", ["tiny-nemotron-h", "tiny-kimi-linear"])
def test_every_family_captures_its_mixed_steps(preset, tmp_path):
    """Mamba2 (SSD) and KDA layers capture too: no op in their chunked paths waits on the device (FLA's
    `chunk_fwd_h` read its chunk count back, which failed every Nemotron capture)."""
    from flashstate.models.presets import materialize

    path = materialize(preset, tmp_path / preset, seed=0)
    llm = _engine(str(path), True, device="cuda", mixed_step_graphs=True, max_model_len=1024)
    mixed = llm.engine.runner.mixed
    assert mixed is not None and mixed._buckets and all(e.graph is not None for e in mixed._buckets.values())
    prompts = [[(5 * i + j) % 900 + 50 for i in range(20 + 17 * j)] for j in range(6)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in outs)
    _assert_pools_full(llm)
