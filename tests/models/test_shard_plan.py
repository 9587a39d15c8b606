"""The split itself, without processes: N rank models (threads summing through a barrier in place of the
all-reduce) give the full model's logits, through prefill, exports and decode, for every family and the
layer kinds the tiny presets lack (Qwen3-Next MoE with attention bias, Nemotron-H latent MoE with biases,
Qwen3.5 / 3.6 dense and MoE, also from a released-layout checkpoint, Granite 4.0-H dense and MoE)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashstate.cache.cache_tensors import CacheTensors
from flashstate.distributed.group import attach_reduce, rank_device
from flashstate.layers.metadata import ForwardMetadata
from flashstate.models.loader import load_model
from flashstate.models.presets import materialize_config
from flashstate.models.shard_plan import Shard, TensorParallelError, shard_spec
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.preset_configs import preset_config
from tests.models import test_granite_moe_hybrid as granite
from tests.models import test_qwen3_5 as qwen3_5

BLOCK = 4


def _config(name: str) -> dict:
    if name == "qwen3-next-moe":
        return preset_config("tiny") | dict(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
            shared_expert_intermediate_size=96, mlp_only_layers=[1], attention_bias=True,
        )  # fmt: skip
    if name == "qwen3-next-4-key-heads":  # two key-head groups per rank: the load-time block re-order of
        # in_proj_qkvz / in_proj_ba (after slicing) is not the identity
        return preset_config("tiny") | dict(
            linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16, linear_value_head_dim=16
        )
    if name == "nemotron-h-latent-moe":
        cfg = preset_config("tiny-nemotron-h")
        return cfg | dict(
            layers_block_type=["mamba", "moe", "attention", "mamba", "mlp", "moe"],
            n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2, moe_intermediate_size=48,
            moe_shared_expert_intermediate_size=64, moe_latent_size=96, mlp_bias=True, use_bias=True,
        )  # fmt: skip
    if name in ("qwen3.5-dense", "qwen3.6-moe"):  # two key heads (four value heads) per rank
        dense = name == "qwen3.5-dense"
        text = qwen3_5.TEXT | dict(linear_num_key_heads=4, linear_num_value_heads=8)
        return (
            text
            | (dict(intermediate_size=40) if dense else qwen3_5.MOE)
            | {
                "architectures": ["Qwen3_5ForCausalLM" if dense else "Qwen3_5MoeForCausalLM"],
                "model_type": "qwen3_5_text" if dense else "qwen3_5_moe_text",
            }
        )
    if name == "granite-h-micro":  # two Mamba2 groups (the released models' one cannot be split)
        return granite.CONFIGS["h-micro"]
    if name == "granite-moe-rope":
        return granite.CONFIGS["rope-untied"] | dict(mamba_n_groups=2)
    return preset_config(name)


def _with_biases(path: Path) -> Path:
    """Random init leaves biases at 0 and norms at 1: perturb them so a bias summed twice shows."""
    file = path / "model.safetensors"
    weights = load_file(file)
    gen = torch.Generator().manual_seed(2)
    for name, t in weights.items():
        if name.endswith("bias") or "norm" in name:
            t.add_(torch.randn(t.shape, generator=gen) * 0.1)
    save_file(weights, file, metadata={"format": "pt"})
    return path


class ThreadRanks:
    """`world` threads, one per rank; `all_reduce` sums in rank order once every rank has arrived."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world)
        self.parts: list[torch.Tensor | None] = [None] * world

    def reducer(self, rank: int):
        def all_reduce(x: torch.Tensor) -> torch.Tensor:
            self.parts[rank] = x.clone()
            self.barrier.wait()
            total = sum(self.parts[1:], self.parts[0].clone())
            self.barrier.wait()
            return x.copy_(total)

        return all_reduce

    def run(self, fns):
        results, errors = [None] * self.world, []

        def go(rank):
            try:
                results[rank] = fns[rank]()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=go, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


def _steps(vocab: int):
    """(query lens, context lens, block tables, slots, exports, tokens) of a prefill with an in-chunk
    export, then a decode of both sequences resuming from their slots."""
    gen = torch.Generator().manual_seed(0)
    tables = [list(range(1, 6)), list(range(6, 11))]
    yield [13, 9], [13, 9], tables, [0, 1], [(0, 6, 2)], torch.randint(0, vocab, (22,), generator=gen)
    yield [1, 1], [14, 10], tables, [0, 1], [], torch.randint(0, vocab, (2,), generator=gen)
    yield [5], [19], tables[:1], [0], [(0, 5, 3)], torch.randint(0, vocab, (5,), generator=gen)


@torch.inference_mode()
def _logits(model, steps):
    caches = CacheTensors.allocate(model.spec, 16, BLOCK, 4, torch.float32)
    caches.bind(model)
    out = []
    for q, c, tables, slots, exports, tokens in steps:
        meta = ForwardMetadata.build(q, c, tables, BLOCK, slots, exports=exports)
        out.append(model.compute_logits(model(tokens, meta)))
    return out, [ssm[2:4].clone() for _, ssm in caches.states]  # the exported checkpoints


@pytest.mark.parametrize(
    "name",
    [
        "tiny", "tiny-nemotron-h", "tiny-kimi-linear", "qwen3-next-moe", "qwen3-next-4-key-heads",
        "nemotron-h-latent-moe", "qwen3.5-dense", "qwen3.6-moe", "granite-h-micro", "granite-moe-rope",
    ],
)  # fmt: skip
def test_two_ranks_sum_to_the_full_model(tmp_path, name):
    _assert_two_ranks_sum_to_the_full_model(
        _with_biases(materialize_config(_config(name), tmp_path / name, seed=1))
    )


def test_a_released_qwen3_6_checkpoint_splits(tmp_path):
    """The multimodal MoE checkpoint as released (`model.language_model.*`, fused experts, an MTP head):
    each rank slices the experts the loader unfuses."""
    hf = qwen3_5._hf_model("moe-multimodal").eval()
    qwen3_5._perturb(hf, seed=1)
    hf.save_pretrained(tmp_path)
    qwen3_5._as_released(tmp_path)
    _assert_two_ranks_sum_to_the_full_model(tmp_path)


def _assert_two_ranks_sum_to_the_full_model(path: Path) -> None:
    full = load_model(path)
    steps = list(_steps(full.spec.vocab_size))
    want = _logits(full, steps)
    ranks = ThreadRanks(2)
    models = [load_model(path, shard=Shard(r, 2)) for r in range(2)]
    for r, m in enumerate(models):
        attach_reduce(m, ranks.reducer(r))
    got = ranks.run([lambda m=m: _logits(m, steps) for m in models])
    for a, b in zip(got[0][0], want[0], strict=True):  # rank 0 holds the full lm_head
        assert float((a - b).norm() / b.norm()) < 1e-5
    for r in range(1, 2):
        assert all(torch.equal(a, b) for a, b in zip(got[r][0], got[0][0], strict=True))
    # Each rank's checkpoints hold its heads: side by side they are the full model's.
    for layer, full_ssm in enumerate(want[1]):
        both = torch.cat([got[0][1][layer], got[1][1][layer]], dim=1)
        assert float((both - full_ssm).norm() / full_ssm.norm()) < 1e-5


def test_rank_spec_and_errors():
    spec = spec_from_hf(preset_config("tiny"))
    half = shard_spec(spec, 2)
    assert (half.attention.num_heads, half.attention.num_kv_heads) == (2, 1)
    assert half.linear.conv_channels * 2 == spec.linear.conv_channels
    assert shard_spec(spec, 1) is spec
    with pytest.raises(TensorParallelError, match="does not divide the attention heads"):
        shard_spec(spec, 3)
    with pytest.raises(TensorParallelError, match="attention key/value heads"):
        shard_spec(spec, 4)
    nemo = spec_from_hf(preset_config("tiny-nemotron-h") | {"num_key_value_heads": 4})  # 2 groups
    with pytest.raises(TensorParallelError, match="mamba2 groups"):
        shard_spec(nemo, 4)


def test_one_gpu_per_rank():
    assert rank_device(torch.device("cuda"), 1) == torch.device("cuda", 1)
    assert rank_device(torch.device("cuda", 2), 1) == torch.device("cuda", 3)
    assert rank_device(torch.device("cpu"), 1) == torch.device("cpu")
