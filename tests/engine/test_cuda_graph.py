import pytest
import torch

from flashstate import LLM, SamplingParams
from flashstate.engine.worker.cuda_graph import capture_sizes


def test_capture_sizes_cover_every_batch_up_to_the_largest():
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = capture_sizes(64)
    assert sizes[-1] == 64 and all(b <= next(s for s in sizes if s >= b) for b in range(1, 65))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_decode_equals_eager_decode(tiny_model_dir):
    prompts = [[(5 * i + j) % 1900 + 50 for i in range(40 + 37 * j)] for j in range(5)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        llm = LLM(
            str(tiny_model_dir),
            device="cuda",
            enforce_eager=eager,
            max_num_seqs=8,
            prefill_cost_coefficients=(1e-6, 0.0),
            kv_cache_memory_bytes=512 << 20,
        )
        assert (llm.engine.runner.graphs is None) == eager
        outs[eager] = [o.token_ids for o in llm.generate(prompts, params)]
        llm.engine.check_integrity()
    assert outs[True] == outs[False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_decode_with_async_scheduling_equals_synchronous(tiny_model_dir):
    prompts = [[(7 * i + j) % 1900 + 50 for i in range(30 + 41 * j)] for j in range(6)]
    params = [
        SamplingParams(temperature=0, max_tokens=20 + 9 * j, stop_token_ids=list(range(50, 2000, 13)))
        for j in range(6)
    ]
    outs = {}
    for mode in (False, True):
        llm = LLM(
            str(tiny_model_dir),
            device="cuda",
            async_scheduling=mode,
            max_num_seqs=4,
            prefill_cost_coefficients=(1e-6, 0.0),
            kv_cache_memory_bytes=512 << 20,
        )
        assert llm.engine.runner.graphs is not None
        outs[mode] = [(o.token_ids, o.finish_reason, o.stop_reason) for o in llm.generate(prompts, params)]
        llm.engine.check_integrity()
    assert outs[True] == outs[False]


def test_mixed_step_buckets_take_every_decode_count_at_most_doubled():
    from flashstate.engine.step_shapes import mixed_decode_sizes

    for top in (1, 2, 3, 6, 48, 96, 256):
        sizes = mixed_decode_sizes(top)
        assert sizes == sorted(set(sizes)) and sizes[-1] == top
        for b in range(1, top + 1):
            fit = next(s for s in sizes if s >= b)
            assert fit < 2 * b or fit == 1
    assert len(mixed_decode_sizes(96)) == 8 < len(capture_sizes(96))
