"""Qwen3.5 / Qwen3.6 (dense and MoE, text-only and multimodal checkpoints) against HF transformers on shrunk
configs (every flag and the layer pattern kept, widths cut), through the paged path: prefill, decode,
chunked prefill, exported states resumed (prefix-cache hits), padding."""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from flashstate.models.loader import load_model
from flashstate.models.qwen3_5 import Qwen3_5ForCausalLM
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.model_spec import UnsupportedModelError
from flashstate.spec.preset_configs import preset_config
from tests.harness import PagedHarness, assert_padding_is_inert, rel_err
from tests.models.test_qwen3_next import _perturb

VOCAB = 96
LAYER_TYPES = [
    "linear_attention",
    "linear_attention",
    "linear_attention",
    "full_attention",
    "linear_attention",
]
TEXT = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=len(LAYER_TYPES), layer_types=LAYER_TYPES,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6, linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6, attn_output_gate=True, dtype="float32",
    # the released models' rope: partial 0.25 (8 of 32 dims), interleaved M-RoPE sections over its halves
    rope_parameters={
        "rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1], "mrope_interleaved": True,
    },
)  # fmt: skip
MOE = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=12, shared_expert_intermediate_size=20)
VISION = dict(
    depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
    num_position_embeddings=16, patch_size=2, temporal_patch_size=1,
)  # fmt: skip


def _hf_model(variant):
    if variant == "dense":  # tied embeddings, as the small released dense models
        return transformers.Qwen3_5ForCausalLM(
            transformers.Qwen3_5TextConfig(**TEXT, intermediate_size=40, tie_word_embeddings=True)
        )
    if variant == "moe":
        return transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**TEXT, **MOE))
    cfg = transformers.Qwen3_5MoeConfig(text_config={**TEXT, **MOE}, vision_config=VISION)
    return transformers.Qwen3_5MoeForConditionalGeneration(cfg)


def _as_released(path):
    """The released multimodal MoE checkpoints' extras: experts stored fused ([E, 2·I, H] gate|up and
    [E, H, I] down) and a multi-token-prediction head (mtp.*), which the loader skips."""
    file = path / "model.safetensors"
    tensors = load_file(file)
    for i in range(len(LAYER_TYPES)):
        block = f"model.language_model.layers.{i}.mlp.experts"
        experts = range(MOE["num_experts"])
        gate_up = [
            torch.cat([tensors.pop(f"{block}.{e}.{p}_proj.weight") for p in ("gate", "up")]) for e in experts
        ]
        tensors[f"{block}.gate_up_proj"] = torch.stack(gate_up)
        tensors[f"{block}.down_proj"] = torch.stack(
            [tensors.pop(f"{block}.{e}.down_proj.weight") for e in experts]
        )
    tensors["mtp.fc.weight"] = torch.zeros(32, 64)
    tensors["mtp.layers.0.input_layernorm.weight"] = torch.zeros(32)
    save_file(tensors, file, metadata={"format": "pt"})


@pytest.fixture(scope="module", params=["dense", "moe", "moe-multimodal"])
def models(request, tmp_path_factory):
    torch.manual_seed(0)
    hf = _hf_model(request.param).eval()
    _perturb(hf, seed=1)
    path = tmp_path_factory.mktemp(f"qwen3_5_{request.param}")
    hf.save_pretrained(path)
    if request.param == "moe-multimodal":
        _as_released(path)
    ours = load_model(path)
    assert isinstance(ours, Qwen3_5ForCausalLM)
    return hf, ours, request.param


def _tokens(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=gen).tolist()


@torch.no_grad()
def _hf_logits(hf, tokens):
    return hf(input_ids=torch.tensor([tokens])).logits[0].float()


def _full(model, tokens):
    return PagedHarness(model).step({0: tokens})[0]


def test_spec_layout_and_names(models):
    hf, ours, variant = models
    spec = ours.spec
    assert spec.architecture == ("Qwen3_5ForCausalLM" if variant == "dense" else "Qwen3_5MoeForCausalLM")
    assert [layer.mixer for layer in spec.layers] == ["linear"] * 3 + ["attention", "linear"]
    assert {layer.ffn for layer in spec.layers} == {"mlp" if variant == "dense" else "moe"}
    assert spec.attention.rotary_dim == 8 and spec.attention.output_gate and spec.attention.qk_norm
    assert spec.tie_word_embeddings == (variant == "dense") and (ours.lm_head is None) == (variant == "dense")
    names = set(ours.state_dict())
    lin = "model.layers.0.linear_attn."
    assert {lin + p + ".weight" for p in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")} <= names
    if variant != "dense":
        assert {
            "model.layers.4.mlp.experts.5.down_proj.weight",
            "model.layers.3.mlp.shared_expert_gate.weight",
        } <= names
        assert spec.moe.norm_topk_prob and spec.moe.shared_expert_gate


def test_varlen_batch_matches_hf(models):
    hf, ours, _ = models
    lens = [70, 5, 1, 33, 129]
    seqs = [_tokens(n, seed=10 + i) for i, n in enumerate(lens)]
    got = PagedHarness(ours).step(dict(enumerate(seqs)))
    for tokens, logits in zip(seqs, got, strict=True):
        ref = _hf_logits(hf, tokens)
        assert ref.std() > 0.3 and (len(tokens) == 1 or rel_err(ref[-1], ref[0]) > 0.1)
        assert rel_err(logits, ref) <= 1e-4


def test_greedy_decode_matches_hf(models):
    """Greedy generation token by token through the paged decode path: the same tokens as HF, and every
    step's fp32 logits within 1e-4."""
    hf, ours, _ = models
    h = PagedHarness(ours)
    ours_tokens, theirs = _tokens(37, seed=3), _tokens(37, seed=3)
    logits = h.step({0: ours_tokens})[0][-1]
    for _ in range(16):
        ref = _hf_logits(hf, theirs)[-1]
        assert rel_err(logits, ref) <= 1e-4
        theirs.append(int(ref.argmax()))
        ours_tokens.append(int(logits.argmax()))
        logits = h.step({0: [ours_tokens[-1]]})[0][-1]
    assert ours_tokens == theirs and len(set(theirs[37:])) > 1


def test_decode_and_chunked_prefill_equal_full_forward(models):
    _, ours, _ = models
    x, y = _tokens(90, seed=4), _tokens(80, seed=5)
    full_x, full_y = _full(ours, x), _full(ours, y)
    h = PagedHarness(ours)
    first_x, first_y = h.step({0: x[:67], 1: y[:7]})
    out_x, out_y = [first_x], [first_y, h.step({1: y[7:67]})[0]]  # y: a chunk past one GDN chunk
    for i in range(13):  # then x and y feed one token a step, side by side
        a, b = h.step({0: [x[67 + i]], 1: [y[67 + i]]})
        out_x.append(a)
        out_y.append(b)
    assert rel_err(torch.cat(out_x), full_x[:80]) <= 1e-5
    assert rel_err(torch.cat(out_y), full_y) <= 1e-5


def test_exported_states_resume_like_full_forward(models):
    """Prefix-cache hits: states exported inside a prefill (inside a GDN chunk, across chunk and block
    boundaries, at the span end) resume to the full forward's logits and greedy tokens."""
    hf, ours, _ = models
    tokens = _tokens(100, seed=6)
    full = _full(ours, tokens)
    h = PagedHarness(ours, num_slots=32)
    cuts = [1, 37, 65, 100]
    h.step({0: tokens}, exports=[(0, n, 20 + e) for e, n in enumerate(cuts)])
    for e, n in enumerate(cuts[:-1]):
        h.fork(0, 2 + e, from_slot=20 + e, length=n)
        assert rel_err(h.step({2 + e: tokens[n:]})[0], full[n:]) <= 1e-5, n
    # a hit on the whole prompt, then greedy decode from it: HF's tokens
    h.fork(0, 9, from_slot=23, length=100)
    seq, ref_seq = list(tokens), list(tokens)
    logits = h.step({9: [5]})[0][-1]
    seq.append(5)
    ref_seq.append(5)
    for _ in range(6):
        ref_seq.append(int(_hf_logits(hf, ref_seq)[-1].argmax()))
        seq.append(int(logits.argmax()))
        logits = h.step({9: [seq[-1]]})[0][-1]
    assert seq == ref_seq
    h.fork(0, 10, from_slot=21, length=65)  # a state from the wrong position shows
    assert rel_err(h.step({10: tokens[65:]})[0], full[65:]) > 1e-3


def test_pad_tokens_change_nothing_real(models):
    _, ours, _ = models
    assert_padding_is_inert(ours, _tokens(18, seed=21), _tokens(18, seed=22))


def _config(tmp_path, variant):
    path = tmp_path / variant
    model = _hf_model(variant)
    model.config.save_pretrained(path)
    return {**json.loads((path / "config.json").read_text()), "architectures": [type(model).__name__]}


@pytest.mark.parametrize("variant", ["dense", "moe", "moe-multimodal"])
def test_renamed_config_is_refused(tmp_path, variant):
    """A config under another family's architecture name never parses as that family."""
    config = _config(tmp_path, variant)
    spec_from_hf(config)  # the real name parses
    others = [
        "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
        "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "NemotronHForCausalLM",
        "KimiLinearForCausalLM",
    ]  # fmt: skip
    for arch in others:
        if arch == config["architectures"][0]:
            continue
        with pytest.raises(UnsupportedModelError, match=arch):
            spec_from_hf({**config, "architectures": [arch]})
        # without model_type to give it away, the fields it lacks (or the nesting) refuse it
        bare = {k: v for k, v in config.items() if k != "model_type"}
        if "text_config" in bare:
            bare["text_config"] = {k: v for k, v in bare["text_config"].items() if k != "model_type"}
        with pytest.raises(UnsupportedModelError):
            spec_from_hf({**bare, "architectures": [arch]})


def test_dense_config_with_experts_and_ungated_attention_are_refused(tmp_path):
    config = _config(tmp_path, "dense")
    with pytest.raises(UnsupportedModelError, match="dense but"):
        spec_from_hf({**config, "num_experts": 8})
    with pytest.raises(UnsupportedModelError, match="output gate"):
        spec_from_hf({**config, "attn_output_gate": False})


def test_qwen3_6_preset_is_the_released_text_model():
    spec = spec_from_hf(preset_config("qwen3.6-35b-a3b"))
    assert spec.architecture == "Qwen3_5MoeForCausalLM" and spec.num_layers == 40
    assert spec.attention_layer_ids == list(range(3, 40, 4)) and spec.dtype == torch.bfloat16
    assert (spec.moe.num_experts, spec.moe.top_k, spec.moe.intermediate_size) == (256, 8, 512)
    assert spec.attention.rotary_dim == 64 and spec.eos_token_ids == (248044,)
