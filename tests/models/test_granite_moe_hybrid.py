"""IBM Granite 4.0-H against HF transformers' `GraniteMoeHybridForCausalLM` on shrunk released configs
(Granite-4.0-H-Tiny: MoE; Granite-4.0-H-Micro: dense; every flag and the layer pattern kept, widths cut),
written as real checkpoints: prefill, decode, chunked prefill, exported states resumed (prefix-cache hits),
padding, and the engine (`flashstate.LLM`) end to end with hits."""

import json
import random

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from flashstate import LLM, SamplingParams
from flashstate.default_tokenizer import write_default_tokenizer
from flashstate.models.granite_moe_hybrid import GraniteMoeHybridForCausalLM
from flashstate.models.loader import load_model
from flashstate.models.param_count import count_active_parameters, count_parameters
from flashstate.models.registry import build_model
from flashstate.models.shard_plan import TensorParallelError, shard_spec
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.model_spec import UnsupportedModelError
from flashstate.spec.preset_configs import DUMMY_ONLY, preset_config
from tests.harness import PagedHarness, assert_padding_is_inert, rel_err
from tests.models.test_nemotron_h import _perturb

VOCAB = 96
# The released layer pattern (attention at 5, 15, 25, 35 of 40), cut to 12 layers: attention at 5 and 11.
LAYER_TYPES = (["mamba"] * 5 + ["attention"]) * 2
# Granite-4.0-H-Tiny's config.json keys and flags, widths cut (hidden 1536 → 32, 12 heads of 128 → 4 of 8,
# 48 Mamba2 heads of 64 → 8 of 8, state 128 → 6, 64 experts top-6 of 512 → 8 top-3 of 12, shared 1024 → 20).
# attention_multiplier is µP's 1/head_dim (0.0078125 = 1/128 released) at the cut head_dim.
TINY = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
    "attention_bias": False, "attention_dropout": 0.0, "attention_multiplier": 1 / 8,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "embedding_multiplier": 12,
    "hidden_act": "silu", "hidden_size": 32, "init_method": "mup", "initializer_range": 0.1,
    "intermediate_size": 12, "layer_types": LAYER_TYPES, "logits_scaling": 6, "mamba_chunk_size": 8,
    "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_head": 8, "mamba_d_state": 6, "mamba_expand": 2,
    "mamba_n_groups": 1, "mamba_n_heads": 8, "mamba_proj_bias": False, "max_position_embeddings": 131072,
    "normalization_function": "rmsnorm", "num_attention_heads": 4, "num_experts_per_tok": 3,
    "num_hidden_layers": len(LAYER_TYPES), "num_key_value_heads": 2, "num_local_experts": 8,
    "output_router_logits": False, "position_embedding_type": "nope", "residual_multiplier": 0.22,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000, "router_aux_loss_coef": 0.0,
    "shared_intermediate_size": 20, "tie_word_embeddings": True, "torch_dtype": "float32",
    "use_cache": True, "vocab_size": VOCAB,
}  # fmt: skip
CONFIGS = {
    "h-tiny": TINY,
    # Granite-4.0-H-Micro: the same layout, dense (no experts: the shared MLP is the FFN), 32 heads of 64
    # (kv 8) cut to 4 of 8 (kv 2); 2 Mamba2 groups here, so the group norm spans more than one group.
    "h-micro": TINY
    | dict(num_local_experts=0, num_experts_per_tok=0, intermediate_size=40, shared_intermediate_size=40,
           mamba_n_groups=2, logits_scaling=8),
    # The flags the released 4.0-H models leave off: rotary attention, biases, an untied head, and
    # transformers 5's layer-type spellings and non-finite time_step_limit.
    "rope-untied": TINY
    | dict(position_embedding_type="rope", rope_theta=500.0, attention_bias=True, tie_word_embeddings=False,
           layer_types=["linear_attention" if t == "mamba" else "full_attention" for t in LAYER_TYPES],
           time_step_limit=[0.0, float("inf")]),
}  # fmt: skip


def _write(config: dict, path, seed: int = 1):
    """A real checkpoint: transformers' model with O(1) random weights (`_perturb`), saved; config.json the
    released text (not transformers' rewrite of it)."""
    torch.manual_seed(0)
    hf = transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(**config)).eval()
    _perturb(hf, seed=seed)
    with torch.no_grad():  # µP: the embeddings small, so that × embedding_multiplier they are O(1)
        hf.model.embed_tokens.weight /= config["embedding_multiplier"]
    hf.save_pretrained(path)
    if "time_step_limit" in config:  # as transformers 5 writes a non-finite float
        config = config | {"time_step_limit": [0.0, {"__float__": "Infinity"}]}
    (path / "config.json").write_text(json.dumps(config))
    return hf


@pytest.fixture(scope="module", params=list(CONFIGS))
def models(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"granite_{request.param}")
    hf = _write(CONFIGS[request.param], path)
    ours = load_model(path)
    assert isinstance(ours, GraniteMoeHybridForCausalLM)
    return hf, ours, path, request.param


def _tokens(n, seed):
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def _hf_logits(hf, tokens):
    return hf(input_ids=torch.tensor([tokens])).logits[0].float()


def _full(model, tokens):
    return PagedHarness(model).step({0: tokens})[0]


def test_spec_reads_the_released_config(models):
    _, ours, path, variant = models
    spec, config = ours.spec, CONFIGS[variant]
    assert [layer.mixer for layer in spec.layers] == [
        "attention" if t in ("attention", "full_attention") else "linear" for t in config["layer_types"]
    ]
    assert {layer.ffn for layer in spec.layers} == {"mlp" if variant == "h-micro" else "moe"}
    assert (spec.embedding_multiplier, spec.residual_multiplier) == (12.0, 0.22)
    assert spec.logits_scaling == config["logits_scaling"] and spec.attention.softmax_scale == 1 / 8
    assert spec.attention.rotary_dim == (8 if variant == "rope-untied" else 0)
    assert spec.tie_word_embeddings == (variant != "rope-untied") and (ours.lm_head is None) == (
        variant != "rope-untied"
    )
    assert spec.linear.state_shape == (8, 8, 6) and spec.linear.time_step_limit == (0.0, float("inf"))
    assert spec.linear.n_groups == config["mamba_n_groups"] and spec.linear.chunk_size == 8
    if spec.moe is not None:
        assert (spec.moe.num_experts, spec.moe.top_k, spec.moe.shared_intermediate_size) == (8, 3, 20)
    # transformers reads the file the same way: its rewrite of the config parses to the same spec
    hf_config = transformers.GraniteMoeHybridConfig.from_pretrained(path).to_dict()
    assert spec_from_hf(hf_config | {"architectures": config["architectures"]}) == spec


def test_varlen_batch_matches_hf(models):
    hf, ours, _, _ = models
    seqs = [_tokens(n, seed=10 + n) for n in (37, 5, 1, 20)]
    got = PagedHarness(ours).step(dict(enumerate(seqs)))
    for tokens, logits in zip(seqs, got, strict=True):
        ref = _hf_logits(hf, tokens)
        assert len(tokens) == 1 or rel_err(ref[-1], ref[0]) > 0.1
        assert rel_err(logits, ref) <= 1e-4
    assert rel_err(got[0][:5], got[1]) > 0.1


def test_greedy_decode_matches_hf(models):
    """Token by token through the paged decode path: HF's greedy tokens, every step's logits within 1e-4."""
    hf, ours, _, _ = models
    h = PagedHarness(ours)
    ours_tokens, theirs = _tokens(21, seed=3), _tokens(21, seed=3)
    logits = h.step({0: ours_tokens})[0][-1]
    for _ in range(12):
        ref = _hf_logits(hf, theirs)[-1]
        assert rel_err(logits, ref) <= 1e-4
        theirs.append(int(ref.argmax()))
        ours_tokens.append(int(logits.argmax()))
        logits = h.step({0: [ours_tokens[-1]]})[0][-1]
    assert ours_tokens == theirs and len(set(theirs[21:])) > 1


def test_decode_and_chunked_prefill_equal_full_forward(models):
    _, ours, _, _ = models
    a, b = _tokens(30, seed=4), _tokens(26, seed=5)
    full_a, full_b = _full(ours, a), _full(ours, b)
    h = PagedHarness(ours)
    out_a, out_b = [h.step({0: a[:17]})[0]], []
    pos_b = 0
    for i, n in enumerate([3, 9, 1, 5, 8]):  # b in uneven chunks (past Mamba2 chunks), beside a's decode
        step = h.step({0: [a[17 + i]], 1: b[pos_b : pos_b + n]})
        out_a.append(step[0])
        out_b.append(step[1])
        pos_b += n
    for t in a[22:]:
        out_a.append(h.step({0: [t]})[0])
    assert rel_err(torch.cat(out_a), full_a) <= 1e-5
    assert rel_err(torch.cat(out_b), full_b) <= 1e-5


def test_exported_states_resume_like_full_forward(models):
    """Prefix-cache hits: states exported inside a prefill (inside a Mamba2 chunk, at chunk and block
    boundaries, at the span end) resume to the full forward's logits; a hit on the whole prompt then decodes
    HF's greedy tokens."""
    hf, ours, _, _ = models
    tokens = _tokens(41, seed=6)
    full = _full(ours, tokens)
    h = PagedHarness(ours, num_slots=32)
    cuts = [1, 13, 16, 41]
    h.step({0: tokens}, exports=[(0, n, 20 + e) for e, n in enumerate(cuts)])
    for e, n in enumerate(cuts[:-1]):
        h.fork(0, 2 + e, from_slot=20 + e, length=n)
        assert rel_err(h.step({2 + e: tokens[n:]})[0], full[n:]) <= 1e-5, n
    h.fork(0, 9, from_slot=23, length=41)
    seq, ref_seq = [*tokens, 5], [*tokens, 5]
    logits = h.step({9: [5]})[0][-1]
    for _ in range(6):
        ref_seq.append(int(_hf_logits(hf, ref_seq)[-1].argmax()))
        seq.append(int(logits.argmax()))
        logits = h.step({9: [seq[-1]]})[0][-1]
    assert seq == ref_seq
    h.fork(0, 10, from_slot=21, length=16)  # a state from the wrong position shows
    assert rel_err(h.step({10: tokens[16:]})[0], full[16:]) > 1e-3


def test_pad_tokens_change_nothing_real(models):
    _, ours, _, _ = models
    assert_padding_is_inert(ours, _tokens(18, seed=21), _tokens(18, seed=22))


def test_engine_with_prefix_hits_matches_hf(models):
    """`flashstate.LLM` on the checkpoint: agents' turns resend their context (hits at arbitrary depths,
    from exported checkpoints) and a sub-agent forks one: HF's greedy tokens, and every sampled step's fp32
    logits within 1e-4 of HF's full forward."""
    hf, _, path, variant = models
    _engine_matches_hf(hf, path, variant, tolerance=1e-4)


# Kernel-friendly widths for the GPU (head dims 32, state 32, Mamba2 chunks of 64), the flags kept.
CUDA_WIDTHS = dict(
    hidden_size=128, num_attention_heads=4, attention_multiplier=1 / 32, mamba_n_heads=8, mamba_d_head=32,
    mamba_d_state=32, mamba_chunk_size=64, intermediate_size=64, shared_intermediate_size=96,
)  # fmt: skip


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("variant", list(CONFIGS))
def test_cuda_engine_with_prefix_hits_matches_hf(variant, tmp_path):
    """The same on the GPU: the Triton kernels (Mamba2 SSD, fused MoE, norms, rotary) and CUDA graphs; fp32
    with TF32 dot products inside the kernels, hence the wider bound."""
    config = CONFIGS[variant] | CUDA_WIDTHS
    hf = _write(config, tmp_path)
    engine = dict(device="cuda", dtype="float32", kv_cache_memory_bytes=64 << 20)
    _engine_matches_hf(hf, tmp_path, variant, tolerance=2e-3, **engine)


def _engine_matches_hf(hf, path, variant: str, tolerance: float, **engine) -> None:
    write_default_tokenizer(path)
    llm = LLM(
        str(path), block_size=4, max_num_batched_tokens=16, max_num_seqs=8,
        prefill_cost_coefficients=(1e-5, 1e-8), mamba_block_size=8, **engine,
    )  # fmt: skip
    logits: dict[str, list[torch.Tensor]] = {}
    llm.engine.runner.on_logits = lambda ids, rows: [
        logits.setdefault(i, []).append(r.float().cpu()) for i, r in zip(ids, rows, strict=True)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    rng = random.Random(variant)
    agents = [_tokens(rng.randint(9, 23), seed=rng.randrange(1000)) for _ in range(2)]
    hits = []
    for _ in range(3):
        fork = agents[0][: rng.randint(3, len(agents[0]))] + _tokens(5, seed=rng.randrange(1000))
        prompts = [*agents, fork]
        outs = llm.generate(prompts, params)
        for prompt, out in zip(prompts, outs, strict=True):
            ref = _hf_logits(hf, prompt + out.token_ids[:-1])[len(prompt) - 1 :]
            assert out.token_ids == ref.argmax(-1).tolist()
            assert rel_err(torch.stack(logits[out.request_id]), ref) <= tolerance
            hits.append(out.num_cached_tokens)
        llm.engine.check_integrity()
        agents = [
            p + o.token_ids + _tokens(rng.randint(1, 7), seed=rng.randrange(1000))
            for p, o in zip(prompts[:2], outs[:2], strict=True)
        ]
    llm.close()
    assert sum(1 for d in hits if d) >= 4 and any(d % 4 for d in hits), hits


def test_transformers_in_memory_names_load_too(models, tmp_path):
    """A checkpoint spelled with transformers 5's module names (`router.weight`, fused
    `experts.gate_up_proj` / `down_proj`) loads to the same model."""
    _, ours, path, variant = models
    if variant == "h-micro":
        pytest.skip("no experts")
    renames = {
        "block_sparse_moe.input_linear.weight": "block_sparse_moe.experts.gate_up_proj",
        "block_sparse_moe.output_linear.weight": "block_sparse_moe.experts.down_proj",
        "block_sparse_moe.router.layer.weight": "block_sparse_moe.router.weight",
    }
    tensors = {}
    for name, t in load_file(path / "model.safetensors").items():
        for old, new in renames.items():
            name = name.replace(old, new)
        tensors[name] = t
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    tokens = _tokens(14, seed=8)
    assert torch.equal(_full(load_model(tmp_path), tokens), _full(ours, tokens))


def test_other_families_configs_are_refused():
    for arch in (
        "NemotronHForCausalLM",
        "Qwen3NextForCausalLM",
        "KimiLinearForCausalLM",
        "Qwen3_5ForCausalLM",
    ):
        with pytest.raises(UnsupportedModelError, match=arch):
            spec_from_hf(TINY | {"architectures": [arch]})
        bare = {k: v for k, v in TINY.items() if k != "model_type"}
        with pytest.raises(UnsupportedModelError):
            spec_from_hf(bare | {"architectures": [arch]})
    for name in ("tiny-nemotron-h", "tiny", "tiny-kimi-linear"):
        bare = {k: v for k, v in preset_config(name).items() if k != "model_type"}
        with pytest.raises(UnsupportedModelError, match="GraniteMoeHybridForCausalLM"):
            spec_from_hf(bare | {"architectures": ["GraniteMoeHybridForCausalLM"]})
    with pytest.raises(UnsupportedModelError, match="position_embedding_type"):
        spec_from_hf(TINY | {"position_embedding_type": "alibi"})
    with pytest.raises(UnsupportedModelError, match="layer_types"):
        spec_from_hf(TINY | {"layer_types": ["mamba"] * 3})


def test_one_mamba2_group_cannot_be_split():
    """Granite 4.0-H's Mamba2 layers have one B/C group, which a head split cannot share: refused by name."""
    with pytest.raises(TensorParallelError, match=r"mamba2 groups \(n_groups\) \(1\)"):
        shard_spec(spec_from_hf(TINY), 2)


def test_granite_4_0_h_tiny_preset():
    """The released shapes (dummy weights only): 6.94B parameters (the model card's 7B), 1.47B used per token
    with the tied embeddings; the module tree has transformers' parameter count."""
    assert "granite-4.0-h-tiny" in DUMMY_ONLY
    config = preset_config("granite-4.0-h-tiny")
    spec = spec_from_hf(config)
    assert spec.attention_layer_ids == [5, 15, 25, 35] and spec.num_layers == 40
    assert (spec.moe.num_experts, spec.moe.top_k, spec.dtype) == (64, 6, torch.bfloat16)
    with torch.device("meta"):
        ours = build_model(spec)
        hf = transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(**config))
    hf_count = sum(p.numel() for p in hf.parameters())
    assert sum(p.numel() for p in ours.parameters()) == count_parameters(spec) == hf_count
    assert round(count_parameters(spec) / 1e7) == 694 and round(count_active_parameters(spec) / 1e7) == 147
