import math

import pytest
import torch
import transformers

from flashstate.models.loader import load_model
from flashstate.models.nemotron_h import NemotronHForCausalLM
from flashstate.spec.hf_config import spec_from_hf
from tests.harness import PagedHarness, assert_padding_is_inert, rel_err

VOCAB = 96
# M = Mamba2, * = attention, - = MLP, E = MoE.
CONFIGS = {
    "dense_moe": dict(pattern="M*-EMM-*EM", n_routed_experts=4, n_group=1, topk_group=1),
    "grouped_latent_moe": dict(
        pattern="ME*M-E", n_routed_experts=8, n_group=2, topk_group=1, moe_latent_size=12
    ),
}


def _hf_config(pattern, **moe):
    return transformers.NemotronHConfig(
        vocab_size=VOCAB, hidden_size=32, hybrid_override_pattern=pattern,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=40,
        mamba_num_heads=8, mamba_head_dim=4, n_groups=2, ssm_state_size=6, conv_kernel=4, expand=1,
        chunk_size=8, time_step_min=0.05, use_conv_bias=True, mlp_hidden_act="relu2",
        num_experts_per_tok=2, moe_intermediate_size=24, moe_shared_expert_intermediate_size=20,
        routed_scaling_factor=2.5, norm_topk_prob=True, layer_norm_epsilon=1e-5,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, dtype="float32", **moe,
    )


@torch.no_grad()
def _perturb(model, seed=0):
    """Replace HF's tiny init with O(1) weights so every path (decays, routing, gates, Δ floor) matters."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            p.copy_(torch.empty(p.shape).uniform_(math.log(0.05), math.log(3.0), generator=g))
        elif leaf == "dt_bias":
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 - 1.5)  # some Δ fall under time_step_min
        elif leaf == "D" or name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
        elif name.endswith("conv1d.weight"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        elif p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
        else:  # biases
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(torch.randn(b.shape, generator=g) * 0.2)


@pytest.fixture(scope="module", params=list(CONFIGS))
def models(request, tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.NemotronHForCausalLM(_hf_config(**CONFIGS[request.param]))
    _perturb(hf)
    hf.eval()
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    ours = load_model(path)
    assert isinstance(ours, NemotronHForCausalLM)
    return hf, ours, path


def _tokens(n, seed):
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _full(model, tokens):
    """Our logits for one sequence in one prefill step: [L, vocab]."""
    return PagedHarness(model).step({0: tokens})[0]


def test_spec_reads_the_hf_config(models):
    hf, ours, _ = models
    spec = ours.spec
    kinds = {"M": "linear", "*": "attention", "-": "mlp", "E": "moe"}
    assert [layer.mixer or layer.ffn for layer in spec.layers] == [
        kinds[c] for c in hf.config.hybrid_override_pattern
    ]
    assert spec.linear.state_shape == (8, 4, 6)
    assert spec.linear.conv_channels == 8 * 4 + 2 * 2 * 6
    assert spec.linear.time_step_limit == (0.05, math.inf)
    assert spec.moe.latent_size == hf.config.moe_latent_size
    assert spec == spec_from_hf(hf.config.to_dict() | {"architectures": ["NemotronHForCausalLM"]})


@torch.no_grad()
def test_varlen_batch_matches_hf(models):
    hf, ours, _ = models
    seqs = [_tokens(n, seed=n) for n in (19, 7, 26, 1)]
    got = PagedHarness(ours).step(dict(enumerate(seqs)))
    for tokens, logits in zip(seqs, got, strict=True):
        want = hf(torch.tensor([tokens])).logits[0]
        assert rel_err(logits, want) < 1e-4
    # The comparison is not trivial: the logits vary along the sequence and between sequences.
    assert rel_err(got[0][:7], got[1]) > 0.1
    assert rel_err(got[0][1:], got[0][:-1]) > 0.1


def test_incremental_decode_and_chunked_prefill_equal_full_forward(models):
    _, ours, _ = models
    a, b = _tokens(23, seed=1), _tokens(18, seed=2)
    full_a, full_b = _full(ours, a), _full(ours, b)
    h = PagedHarness(ours)
    # a: prefill 9, then decode one token at a time; b: chunked prefill in uneven pieces, batched with a.
    pieces_b = [5, 6, 1, 3, 3]
    out_a, out_b = [h.step({0: a[:9]})[0]], []
    pos_a, pos_b = 9, 0
    for n in pieces_b:
        step = h.step({0: a[pos_a:pos_a + 1], 1: b[pos_b:pos_b + n]})
        out_a.append(step[0])
        out_b.append(step[1])
        pos_a, pos_b = pos_a + 1, pos_b + n
    while pos_a < len(a):  # pure decode steps (the recurrent form)
        out_a.append(h.step({0: a[pos_a:pos_a + 1]})[0])
        pos_a += 1
    assert rel_err(torch.cat(out_a), full_a) < 1e-5
    assert rel_err(torch.cat(out_b), full_b) < 1e-5


def test_decode_batch_uses_pooled_states_per_sequence(models):
    _, ours, _ = models
    seqs = [_tokens(n, seed=10 + n) for n in (6, 11, 5)]
    fulls = [_full(ours, s) for s in seqs]
    h = PagedHarness(ours)
    prefix = [s[:-4] for s in seqs]
    h.step({i: p for i, p in enumerate(prefix)})
    # A decode step may also export (a frontier checkpoint): sequence 1 after its 2nd decoded token.
    steps = [
        h.step({i: [s[len(s) - 4 + k]] for i, s in enumerate(seqs)}, exports=[(1, 1, 20)] if k == 1 else None)
        for k in range(4)
    ]
    for i, full in enumerate(fulls):
        assert rel_err(torch.cat([st[i] for st in steps]), full[-4:]) < 1e-5
    h.fork(1, 9, from_slot=20, length=len(seqs[1]) - 2)
    assert rel_err(h.step({9: seqs[1][-2:]})[0], fulls[1][-2:]) < 1e-5


def test_states_exported_mid_prefill_resume_exactly(models):
    _, ours, _ = models
    seqs = {0: _tokens(29, seed=3), 1: _tokens(13, seed=4)}
    tail = [7, 8]  # resumed runs go past the original end
    fulls = {i: _full(ours, s + tail) for i, s in seqs.items()}
    h = PagedHarness(ours, block_size=4)
    # Export positions: inside the first SSD chunk, past chunk/block ends, and at span ends.
    exports = [(0, 3, 20), (0, 13, 21), (0, 29, 22), (1, 6, 23), (1, 13, 24)]
    h.step(seqs, exports=exports)
    for n, (src, length, slot) in enumerate(exports):
        h.fork(src, 5 + n, from_slot=slot, length=length)
        got = h.step({5 + n: seqs[src][length:] + tail})[0]
        assert rel_err(got, fulls[src][length:]) < 1e-5, (src, length)


@torch.no_grad()
def test_bf16_checkpoint_keeps_router_bias_fp32(models, tmp_path):
    hf, _, path = models
    # from_pretrained keeps the bias fp32 in a bf16 model (`_keep_in_fp32_modules_strict`), and so do real
    # checkpoints; a rounded bias could change which experts are picked.
    hf_bf16 = transformers.NemotronHForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, experts_implementation="eager"  # grouped_mm rejects odd latent sizes
    )
    hf_bf16.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    assert ours.backbone.embeddings.weight.dtype == torch.bfloat16
    bias = [b for n, b in ours.named_buffers() if n.endswith("e_score_correction_bias")]
    assert bias and all(b.dtype == torch.float32 for b in bias)
    want = [b for n, b in hf.named_buffers() if n.endswith("e_score_correction_bias")]
    assert all(torch.equal(x, y) for x, y in zip(bias, want, strict=True))
    tokens = _tokens(12, seed=5)
    got = PagedHarness(ours, dtype=torch.bfloat16).step({0: tokens})[0]
    assert rel_err(got, hf_bf16(torch.tensor([tokens])).logits[0]) < 0.05


def test_pad_tokens_after_the_last_span_change_nothing_real(models):
    """ForwardMetadata's padding (fixed shapes for graphed mixed steps): masked out of the recurrent updates,
    their KV in the pad block, the conv window read at the last real token."""
    _, ours, _ = models
    assert_padding_is_inert(ours, _tokens(18, seed=21), _tokens(18, seed=22))
