"""Each family's tiny model through the engine with our Triton kernels (run by Triton's interpreter on the
CPU) in place of the naive ops: the kernels wired into the model (views, strides, pools, the decode path)
give the naive ops' greedy tokens, prefix hits and logits. FLA's kernels are not ours and stay naive.
Needs `triton` (CI's CPU venv skips this file); on a GPU the engine's own runs cover this."""

import importlib
import os

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("the interpreter stands in for a GPU only where there is none", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first @triton.jit of our kernels
pytest.importorskip("triton")

from flashstate import LLM, SamplingParams  # noqa: E402
from flashstate.models.presets import preset_dir  # noqa: E402

# package → its Triton module, for every op dispatched through `backend` that has one of ours
OURS = {
    "activation": "triton",
    "attention": "triton",
    "gated_delta_rule": "decode_triton",
    "gdn_gating": "triton",
    "qk_norm_rope": "triton",
    "rotary": "triton",
    "short_conv": "triton",
}


def _generate(monkeypatch, preset: str, kernels: bool):
    if kernels:
        for package in OURS:
            module = importlib.import_module(f"flashstate.ops.{package}")
            original = module.backend

            def choose(pkg, gpu_module, probe, original=original):
                if OURS.get(pkg) == gpu_module:
                    return importlib.import_module(f"flashstate.ops.{pkg}.{gpu_module}")
                return original(pkg, gpu_module, probe)

            monkeypatch.setattr(module, "backend", choose)
    engine = dict(block_size=16, max_num_batched_tokens=64, max_num_seqs=4, async_scheduling=False)
    with LLM(str(preset_dir(preset)), prefill_cost_coefficients=(1e-5, 1e-8), **engine) as llm:
        logits = []
        llm.engine.runner.on_logits = lambda ids, rows: logits.append(rows.clone())
        prompts = [[(7 * i + j) % 1500 + 3 for i in range(40 + 13 * j)] for j in range(3)]
        first = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        again = [p + o.token_ids + [5, 6, 7] for p, o in zip(prompts, first, strict=True)]
        second = llm.generate(again, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        llm.engine.check_integrity()
    monkeypatch.undo()
    outs = first + second
    return [o.token_ids for o in outs], [o.num_cached_tokens for o in second], logits


@pytest.mark.parametrize("preset", ["tiny", "tiny-nemotron-h", "tiny-kimi-linear"])
def test_the_tiny_models_with_our_kernels_give_the_naive_ops_tokens(monkeypatch, preset):
    want_tokens, want_hits, want_logits = _generate(monkeypatch, preset, kernels=False)
    tokens, hits, logits = _generate(monkeypatch, preset, kernels=True)
    assert tokens == want_tokens
    assert hits == want_hits and all(h > 0 for h in hits)  # the second turns resume over cached prefixes
    assert len(logits) == len(want_logits)
    for got, want in zip(logits, want_logits, strict=True):
        assert float((got - want).norm() / want.norm()) < 1e-5
