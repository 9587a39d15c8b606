import math
from unittest.mock import patch

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from flashstate.models.kimi_linear import KimiLinearForCausalLM, MultiLatentAttention
from flashstate.models.loader import load_model
from flashstate.spec.hf_config import spec_from_hf
from tests.harness import PagedHarness, assert_padding_is_inert, rel_err

VOCAB = 96
BASE = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=5,
    num_attention_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12,
    linear_num_heads=2, linear_head_dim=8, num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention",
                 "full_attention"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"],
    pad_token_id=0, bos_token_id=1, eos_token_id=2, dtype="float32",
)
CONFIGS = {
    "plain": {},
    # low-rank q, biases, grouped routing, two shared experts
    "lora": dict(q_lora_rank=12, attention_bias=True, num_local_experts=8, n_group=4, topk_group=2,
                 n_shared_experts=2, num_experts_per_tok=3),
}


def _perturb(model, seed):
    """HF's init (std 0.02, unit norms, zero router bias) makes a tiny model nearly linear and leaves code
    paths untested: give every tensor O(1) activations, and decays from a few tokens to hundreds."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 2.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(-2.5 + 1.5 * noise)  # softplus in both regimes: long and short memory
            elif "norm" in name:
                p.copy_(1 + 0.2 * noise)
            elif name.endswith("e_score_correction_bias") or name.endswith(".bias"):
                p.copy_(0.1 * noise)
            elif "conv1d" in name:
                p.copy_(0.5 * noise)
            elif "f_b_proj" in name:
                p.copy_(0.3 * noise / math.sqrt(p.shape[-1]))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(noise)
            else:  # linear and expert weights [..., out, in]
                p.copy_(noise / math.sqrt(p.shape[-1]))


@pytest.fixture(scope="module", params=list(CONFIGS))
def models(request, tmp_path_factory):
    cfg = transformers.KimiLinearConfig(**(BASE | CONFIGS[request.param]))
    torch.manual_seed(0)
    hf = transformers.KimiLinearForCausalLM(cfg).eval()
    _perturb(hf, seed=1)
    path = tmp_path_factory.mktemp(f"kimi_{request.param}")
    hf.save_pretrained(path)
    return hf, load_model(path), path


def _tokens(lens, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in lens]


def _full(model, seqs):
    return PagedHarness(model).step(dict(enumerate(seqs)))


def test_spec_and_names_follow_the_hf_checkpoint(models):
    _, ours, path = models
    spec = spec_from_hf(path)
    assert spec.attention_layer_ids == [1, 4] and spec.linear_layer_ids == [0, 2, 3]
    assert [layer.ffn for layer in spec.layers] == ["mlp", "moe", "moe", "moe", "moe"]
    assert spec.linear.conv_channels == 3 * 2 * 8 and spec.attention.head_dim == 12
    assert isinstance(ours, KimiLinearForCausalLM)
    assert set(ours.state_dict()) == set(load_file(path / "model.safetensors"))


def test_logits_match_hf_per_sequence(models):
    hf, ours, _ = models
    seqs = _tokens([70, 5, 1, 33], seed=2)
    got = _full(ours, seqs)
    for seq, logits in zip(seqs, got, strict=True):
        with torch.no_grad():
            ref = hf(torch.tensor([seq])).logits[0]
        assert rel_err(logits, ref) < 1e-4
    # Non-degenerate: logits move with position and input.
    assert rel_err(got[0][1:], got[0][:-1]) > 0.1


def test_decode_and_chunked_prefill_equal_the_full_forward(models):
    _, ours, _ = models
    seqs = _tokens([40, 75, 9], seed=3)
    full = _full(ours, seqs)

    h = PagedHarness(ours)
    prefix = [20, 67, 3]
    got = [[x] for x in h.step({i: s[:p] for i, (s, p) in enumerate(zip(seqs, prefix, strict=True))})]
    for t in range(max(len(s) - p for s, p in zip(seqs, prefix, strict=True))):
        batch = {i: [s[p + t]] for i, (s, p) in enumerate(zip(seqs, prefix, strict=True)) if p + t < len(s)}
        for i, logits in zip(batch, h.step(batch), strict=True):  # every span is one token: decode form
            got[i].append(logits)
    for parts, ref in zip(got, full, strict=True):
        assert rel_err(torch.cat(parts), ref) < 1e-5

    h = PagedHarness(ours)
    pieces = [[7, 30, 1, 2], [64, 1, 1, 9], [2, 2, 4, 1]]  # one-token spans mixed with prefill spans
    got = [[] for _ in seqs]
    done = [0] * len(seqs)
    for step in range(4):
        batch = {i: seqs[i][done[i] : done[i] + pieces[i][step]] for i in range(len(seqs))}
        for i, logits in zip(batch, h.step(batch), strict=True):
            got[i].append(logits)
            done[i] += pieces[i][step]
    for i, ref in enumerate(full):
        assert rel_err(torch.cat(got[i]), ref[: done[i]]) < 1e-5


def test_states_exported_mid_prefill_resume_exactly(models):
    _, ours, _ = models
    seqs = _tokens([108, 30], seed=4)
    full = _full(ours, seqs)
    # Inside the first chunk, at a block / chunk boundary, just after it, mid-chunk, and the span ends.
    exports = [(0, n, 10 + j) for j, n in enumerate([1, 13, 64, 65, 77, 100])] + [(1, 19, 16), (1, 30, 17)]
    h = PagedHarness(ours)
    h.step({0: seqs[0][:100], 1: seqs[1]}, exports=exports)
    resumed = {}
    for j, (src, n, slot) in enumerate(exports):
        if n == len(seqs[src]):
            continue  # nothing left to resume with
        h.fork(src, 20 + j, from_slot=slot, length=n)
        resumed[20 + j] = (src, n)
    out = h.step({dst: seqs[src][n:] for dst, (src, n) in resumed.items()})
    for logits, (src, n) in zip(out, resumed.values(), strict=True):
        assert rel_err(logits, full[src][n:]) < 1e-5
    # The states matter: resuming after 77 tokens from the state exported after 65 is far off.
    h.fork(0, 31, from_slot=13, length=77)
    wrong = h.step({31: seqs[0][77:]})[0]
    assert rel_err(wrong, full[0][77:]) > 1e-2


def test_moonshot_dense_mlp_names_load_too(models, tmp_path):
    _, ours, path = models
    tensors = load_file(path / "model.safetensors")
    renamed = {k.replace("layers.0.block_sparse_moe.", "layers.0.mlp."): v for k, v in tensors.items()}
    assert "model.layers.0.mlp.gate_proj.weight" in renamed
    save_file(renamed, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    other = load_model(tmp_path)
    for (name, a), b in zip(ours.state_dict().items(), other.state_dict().values(), strict=True):
        assert a.equal(b), name


def test_expanded_attention_equals_the_latent_path_fresh_and_over_a_cached_prefix(models):
    # On CUDA a prefill of long spans expands each sequence's cached latents into per-head K/V for fused
    # SDPA; everything else attends over the cached latents with kv_b_proj absorbed. The same function,
    # for fresh prompts and for new tokens after a cached prefix.
    _, ours, _ = models
    seqs = _tokens([30, 17], seed=5)
    h = PagedHarness(ours)
    mla = next(m for m in ours.modules() if isinstance(m, MultiLatentAttention))
    calls = []

    def both(q, meta):
        calls.append(meta.context_lens.tolist())
        expanded = MultiLatentAttention.attend_expanded(mla, q, meta)
        latent = mla.attend_latent(q, meta)
        assert expanded.shape == latent.shape and rel_err(expanded, latent) < 1e-5
        return expanded

    mla.attend_expanded = both
    try:
        with patch("flashstate.models.kimi_linear.long_spans", return_value=True):
            h.step({i: s[:11] for i, s in enumerate(seqs)})  # fresh prompts
            h.step({i: s[11:] for i, s in enumerate(seqs)})  # the rest, over the cached 11 tokens
    finally:
        del mla.attend_expanded
    assert calls == [[11, 11], [30, 17]]


def test_pad_tokens_after_the_last_span_change_nothing_real(models):
    """ForwardMetadata's padding (fixed shapes for graphed mixed steps): masked out of the recurrent updates,
    their KV in the pad block, the conv window read at the last real token."""
    _, ours, _ = models
    assert_padding_is_inert(ours, *_tokens([18, 18], seed=21))
