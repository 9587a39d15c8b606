"""Qwen3-Next against HF transformers on tiny random weights, and state reuse through the paged path."""

import pytest
import torch
import torch.nn.functional as F
import transformers

from flashstate.models.loader import load_model
from flashstate.models.qwen3_next import Qwen3NextForCausalLM
from tests.harness import PagedHarness, assert_padding_is_inert, rel_err

LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"]
COMMON = dict(
    vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=len(LAYER_TYPES),
    layer_types=LAYER_TYPES, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, dtype="float32",
)
VARIANTS = {
    # MoE everywhere except layer 2, which is a dense MLP; untied head; partial rotary 0.25 (4 of 16 dims)
    "moe": dict(
        num_experts=6, num_experts_per_tok=2, moe_intermediate_size=12, shared_expert_intermediate_size=20,
        decoder_sparse_step=1, mlp_only_layers=[2], norm_topk_prob=True,
    ),
    # Dense MLP in every layer, tied embeddings, half of each head rotated
    "dense": dict(
        num_experts=0, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5},
    ),
}


def _perturb(model, seed):
    """HF's init is tiny (std 0.02, zero norms) and its decays near 0: make every tensor O(1)-effective
    and give the GDN heads memories from a few to ~100 tokens, so that a wrong state shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 4 - 4)  # A ∈ [0.018, 1]
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.dim() == 1:  # norm weights
                centre = 1.0 if "linear_attn.norm" in name else 0.0  # the gated norm is not zero-centred
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + centre)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


@pytest.fixture(scope="module", params=list(VARIANTS))
def models(request, tmp_path_factory):
    cfg = transformers.Qwen3NextConfig(**COMMON, **VARIANTS[request.param])
    torch.manual_seed(0)
    hf = transformers.Qwen3NextForCausalLM(cfg).eval()
    _perturb(hf, seed=1)
    path = tmp_path_factory.mktemp(f"qwen3_next_{request.param}")
    hf.save_pretrained(path)
    ours = load_model(path)
    assert isinstance(ours, Qwen3NextForCausalLM)
    return hf, ours


def _tokens(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, COMMON["vocab_size"], (n,), generator=gen).tolist()


@torch.no_grad()
def _hf_logits(hf, tokens):
    return hf(torch.tensor([tokens])).logits[0].float()


def _full(model, tokens):
    """Our logits for one sequence prefilled in one step from an empty cache. It binds fresh caches into
    the model: call it before building the harness under test."""
    return PagedHarness(model).step({0: tokens})[0]


def test_layout_and_names(models):
    hf, ours = models
    spec = ours.spec
    assert [layer.mixer for layer in spec.layers] == ["linear", "attention", "linear", "linear", "attention"]
    ours_names = set(ours.state_dict())
    if spec.tie_word_embeddings:
        assert ours.lm_head is None
    else:
        assert {
            "lm_head.weight", "model.layers.0.mlp.experts.5.gate_proj.weight",
            "model.layers.0.mlp.shared_expert_gate.weight", "model.layers.2.mlp.up_proj.weight",
        } <= ours_names
    assert {"model.layers.0.linear_attn.in_proj_qkvz.weight", "model.layers.1.self_attn.q_norm.weight",
            "model.layers.0.linear_attn.conv1d.weight", "model.layers.0.linear_attn.A_log"} <= ours_names


def test_varlen_batch_matches_hf(models):
    hf, ours = models
    lens = [70, 5, 1, 33, 129]
    seqs = [_tokens(n, seed=10 + i) for i, n in enumerate(lens)]
    got = PagedHarness(ours).step(dict(enumerate(seqs)))
    for tokens, logits in zip(seqs, got, strict=True):
        ref = _hf_logits(hf, tokens)
        # the comparison is meaningful: logits spread out and depend on the position
        assert ref.std() > 0.3 and (len(tokens) == 1 or rel_err(ref[-1], ref[0]) > 0.1)
        assert rel_err(logits, ref) <= 1e-4


def test_prefix_matters(models):
    """Changing only the first token moves the last token's logits: the states carry information."""
    _, ours = models
    a = _tokens(40, seed=3)
    b = [(a[0] + 1) % COMMON["vocab_size"], *a[1:]]
    assert rel_err(_full(ours, a)[-1], _full(ours, b)[-1]) > 1e-2


def test_decode_and_chunked_prefill_equal_full_forward(models):
    _, ours = models
    x, y = _tokens(90, seed=4), _tokens(80, seed=5)
    full_x, full_y = _full(ours, x), _full(ours, y)
    h = PagedHarness(ours)
    # x: prefill 67 tokens (past one GDN chunk), then decode one token at a time alongside y.
    # y: chunked prefill in uneven pieces (7, 60, 1, 3) next to x's steps, then decode.
    out_x, out_y = [], []
    a, b = h.step({0: x[:67], 1: y[:7]})
    out_x.append(a)
    out_y.append(b)
    y_at = 7
    for piece in (60, 1, 3):
        a, b = h.step({0: [x[len(torch.cat(out_x))]], 1: y[y_at : y_at + piece]})
        out_x.append(a)
        out_y.append(b)
        y_at += piece
    while y_at < len(y):  # decode steps: every sequence feeds one token
        a, b = h.step({0: [x[len(torch.cat(out_x))]], 1: [y[y_at]]})
        out_x.append(a)
        out_y.append(b)
        y_at += 1
    got_x, got_y = torch.cat(out_x), torch.cat(out_y)
    assert rel_err(got_y, full_y) <= 1e-5
    assert rel_err(got_x, full_x[: len(got_x)]) <= 1e-5
    assert len(got_x) == 67 + 3 + len(y) - 71


def test_exported_states_resume_like_full_forward(models):
    _, ours = models
    tokens = _tokens(100, seed=6)
    other = _tokens(30, seed=7)
    full, full_other, full_longer = _full(ours, tokens), _full(ours, other), _full(ours, tokens + [5])
    h = PagedHarness(ours, num_slots=32)
    # Export inside the first GDN chunk, across chunk and KV-block boundaries, and at the span end.
    cuts = [1, 37, 65, 99, 100]
    h.step({0: tokens, 1: other}, exports=[(0, n, 20 + e) for e, n in enumerate(cuts)] + [(1, 13, 30)])
    for e, n in enumerate(cuts):
        dst = 2 + e
        h.fork(0, dst, from_slot=20 + e, length=n)
        rest = tokens[n:] or [5]
        got = h.step({dst: rest})[0]
        if n < len(tokens):
            assert rel_err(got, full[n:]) <= 1e-5, n
        else:
            assert rel_err(got, full_longer[-1:]) <= 1e-5
    # A state from the wrong position gives visibly different logits (the check above can fail).
    h.fork(0, 10, from_slot=21, length=65)
    assert rel_err(h.step({10: tokens[65:]})[0], full[65:]) > 1e-3
    # The other sequence's export resumes it too.
    h.fork(1, 11, from_slot=30, length=13)
    assert rel_err(h.step({11: other[13:]})[0], full_other[13:]) <= 1e-5


def test_projections_split_into_the_checkpoint_parts_bit_for_bit(models):
    """The block layout of in_proj_qkvz / in_proj_ba (re-ordered at load) gives exactly the values of the
    checkpoint's per-group layout; the stacked GEMMs (qkvz|ba, gate|up) those of separate GEMMs, to fp32
    rounding (a BLAS may block a wider GEMM differently: on AVX-512 CPUs the last bits differ)."""
    hf, ours = models
    x = torch.randn(23, COMMON["hidden_size"], generator=torch.Generator().manual_seed(9))
    nk, nv = COMMON["linear_num_key_heads"], COMMON["linear_num_value_heads"]
    dk, dv, r = COMMON["linear_key_head_dim"], COMMON["linear_value_head_dim"], nv // nk
    theirs, mine = hf.model.layers[0].linear_attn, ours.model.layers[0].linear_attn
    with torch.no_grad():
        grouped = F.linear(x, theirs.in_proj_qkvz.weight).view(23, nk, -1).split([dk, dk, r * dv, r * dv], -1)
        blocks = mine.in_proj_qkvz(x).split([nk * dk, nk * dk, nv * dv, nv * dv], dim=-1)
        for want, got in zip(grouped, blocks, strict=True):
            assert torch.equal(want.reshape(23, -1), got)
        b, a = F.linear(x, theirs.in_proj_ba.weight).view(23, nk, 2 * r).split([r, r], dim=-1)
        assert torch.equal(torch.cat([b.reshape(23, -1), a.reshape(23, -1)], -1), mine.in_proj_ba(x))
        assert mine.stacked_weight().data_ptr() == mine.in_proj_qkvz.weight.data_ptr()  # one GEMM, no copy
        both = F.linear(x, mine.stacked_weight())
        fp32 = dict(rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(both, torch.cat([mine.in_proj_qkvz(x), mine.in_proj_ba(x)], -1), **fp32)
        mlp = ours.model.layers[2].mlp
        assert mlp.stacked_weight().data_ptr() == mlp.gate_proj.weight.data_ptr()  # one GEMM, no copy
        torch.testing.assert_close(mlp(x), mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x)), **fp32)


def test_pad_tokens_after_the_last_span_change_nothing_real(models):
    """ForwardMetadata's padding (fixed shapes for graphed mixed steps): masked out of the recurrent updates,
    their KV in the pad block, the conv window read at the last real token."""
    _, ours = models
    assert_padding_is_inert(ours, _tokens(18, seed=21), _tokens(18, seed=22))
