"""Block-FP8 checkpoints (the published DeepSeek-V3 / Qwen3-*-FP8 layout) on the CPU path, which
dequantizes: a shrunk Qwen3-Next (every width a whole number of 128-blocks, MoE with a shared expert and a
dense layer kept) saved by transformers in bf16, and the same weights written as an FP8 checkpoint
(config.json `quantization_config`, `weight_scale_inv` tensors, per-expert weights) by `quantize_block`.

Bounds. The FP8 path itself is exact: its fp32 logits equal, to DEQUANT_REL_ERR = 1e-5 relative
(measured 1.3e-6), those of the same model with every FP8 weight dequantized and stored in fp32. The
quantization error against the bf16 source is large on this model, whose random weights are made
O(1)-effective in every layer (e4m3 keeps 3 mantissa bits: ~3% per weight, compounded over four mixers,
four FFNs and a GDN recurrence): relative logit error (‖Δ‖ / ‖ref‖ over the prompt's 40 positions, fp32)
measured 0.23, asserted below FP8_LOGIT_REL_ERR = 0.4. Greedy tokens agree for the first
FP8_SAME_TOKENS = 6 of 8 (measured 7: the margins between this random model's top logits are small)."""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import flashstate
from flashstate.default_tokenizer import write_default_tokenizer
from flashstate.layers.fp8_linear import Fp8Linear
from flashstate.models.loader import CheckpointError, load_model
from flashstate.ops.fp8.block_quant import FP8_DTYPE, dequantize_block, quantize_block
from flashstate.sampling_params import SamplingParams
from flashstate.spec.preset_configs import preset_config
from flashstate.spec.quantization import QuantizationError, quantization_from_hf
from tests.harness import PagedHarness, rel_err

DEQUANT_REL_ERR = 1e-5
FP8_LOGIT_REL_ERR = 0.4
FP8_SAME_TOKENS = 6
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
CONFIG = dict(
    vocab_size=2048, hidden_size=256, intermediate_size=256, num_hidden_layers=4, layer_types=LAYER_TYPES,
    num_attention_heads=2, num_key_value_heads=1, head_dim=128, linear_num_key_heads=2,
    linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128,
    decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=True, tie_word_embeddings=False,
    rms_norm_eps=1e-6, dtype="bfloat16", eos_token_id=2, pad_token_id=0,
)  # fmt: skip
PROMPT = list(range(7, 47))
ENGINE = dict(prefill_cost_coefficients=(1e-5, 1e-10), max_model_len=256)  # no calibration run
# Linear layers the published Qwen3-Next FP8 checkpoint keeps in bf16 (besides lm_head)
NOT_CONVERTED = ("mlp.gate", "mlp.shared_expert_gate", "linear_attn.in_proj_ba")


def _perturb(model, seed):
    """O(1)-effective weights (HF's init is tiny) and GDN memories of a few to ~100 tokens."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 4 - 4)
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.dim() == 1:
                centre = 1.0 if "linear_attn.norm" in name else 0.0
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + centre)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def _unfused(state):
    """transformers 5's fused expert tensors as the published per-expert weights."""
    out = {}
    for name, t in state.items():
        block, _, part = name.rpartition(".experts.")
        if part == "gate_up_proj":
            for e, w in enumerate(t):
                gate, up = w.chunk(2, dim=0)
                out[f"{block}.experts.{e}.gate_proj.weight"] = gate
                out[f"{block}.experts.{e}.up_proj.weight"] = up
        elif part == "down_proj":
            for e, w in enumerate(t):
                out[f"{block}.experts.{e}.down_proj.weight"] = w
        else:
            out[name] = t
    return out


def _not_converted(config):
    skip = ["lm_head"]
    for i, kind in enumerate(config["layer_types"]):
        p = f"model.layers.{i}"
        skip += [f"{p}.input_layernorm", f"{p}.post_attention_layernorm"]
        if kind == "linear_attention":
            skip += [f"{p}.linear_attn.{m}" for m in ("A_log", "conv1d", "dt_bias", "in_proj_ba", "norm")]
        else:
            skip += [f"{p}.self_attn.k_norm", f"{p}.self_attn.q_norm"]
        if i not in config["mlp_only_layers"]:
            skip += [f"{p}.mlp.gate", f"{p}.mlp.shared_expert_gate"]
    return skip


def write_fp8_checkpoint(src, dst):
    """`src` (a bf16 HF checkpoint) as an FP8 one in the published layout: every linear weight but the
    LM head, routers, shared-expert gates and in_proj_ba block-quantized, with its `weight_scale_inv`."""
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [128, 128], "modules_to_not_convert": _not_converted(config),
    }  # fmt: skip
    (dst / "config.json").write_text(json.dumps(config))
    state = {}
    for name, t in _unfused(load_file(str(src / "model.safetensors"))).items():
        linear = name.endswith(".weight") and t.dim() == 2 and "embed_tokens" not in name
        if linear and name != "lm_head.weight" and not name.removesuffix(".weight").endswith(NOT_CONVERTED):
            state[name], state[name.removesuffix("weight") + "weight_scale_inv"] = quantize_block(t)
        else:
            state[name] = t
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    write_default_tokenizer(dst)
    return dst


def write_dequantized_checkpoint(src, dst):
    """FP8 checkpoint `src` with every FP8 weight dequantized to fp32 (and no quantization_config)."""
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    del config["quantization_config"]
    (dst / "config.json").write_text(json.dumps(config | {"dtype": "float32"}))
    stored, state = load_file(str(src / "model.safetensors")), {}
    for name, t in stored.items():
        if t.dtype == FP8_DTYPE:
            t = dequantize_block(t, stored[name.removesuffix("weight") + "weight_scale_inv"], torch.float32)
        if not name.endswith("weight_scale_inv"):
            state[name] = t.float()
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**CONFIG)).to(torch.bfloat16).eval()
    _perturb(hf, seed=1)
    bf16 = tmp_path_factory.mktemp("qwen3_next_bf16")
    hf.save_pretrained(bf16)
    write_default_tokenizer(bf16)
    return bf16, write_fp8_checkpoint(bf16, tmp_path_factory.mktemp("qwen3_next_fp8"))


def _logits(path, **kw):
    model = load_model(path, dtype=torch.float32, **kw)
    return model, PagedHarness(model).step({0: PROMPT})[0]


def _greedy(path, n=8, **kw):
    with flashstate.LLM(str(path), dtype="float32", **ENGINE, **kw) as llm:
        out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    return list(out[0].token_ids)


def test_fp8_checkpoint_within_bound_of_bf16_source(checkpoints, tmp_path):
    bf16, fp8 = checkpoints
    model, fp8_logits = _logits(fp8)
    quantized = {n for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    assert "model.layers.0.linear_attn.in_proj_qkvz" in quantized
    assert {"model.layers.2.mlp.experts.3.down_proj", "model.layers.1.mlp.gate_proj"} <= quantized
    assert not {"lm_head", "model.layers.0.mlp.gate", "model.layers.0.linear_attn.in_proj_ba"} & quantized
    assert model.model.layers[0].linear_attn.in_proj_qkvz.weight.dtype == FP8_DTYPE
    _, dequantized = _logits(write_dequantized_checkpoint(fp8, tmp_path / "dequantized"))
    assert rel_err(fp8_logits, dequantized) < DEQUANT_REL_ERR
    _, ref = _logits(bf16)
    err = rel_err(fp8_logits, ref)
    print(f"fp8 vs bf16 source: logits rel err {err:.4f}")
    assert err < FP8_LOGIT_REL_ERR
    a, b = _greedy(fp8), _greedy(bf16)
    print(f"greedy fp8 {a} bf16 {b}")
    assert a[:FP8_SAME_TOKENS] == b[:FP8_SAME_TOKENS], (a, b)


def test_quantize_on_load_equals_fp8_checkpoint(checkpoints):
    bf16, fp8 = checkpoints
    online, online_logits = _logits(bf16, quantization="fp8")
    stored, stored_logits = _logits(fp8)
    assert torch.equal(online_logits, stored_logits)
    a, b = online.state_dict(), stored.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k].float(), b[k].float()) for k in a)
    # --quantization fp8 on a checkpoint that already is FP8 keeps it
    again, again_logits = _logits(fp8, quantization="fp8")
    assert torch.equal(again_logits, stored_logits)


def test_missing_scale_is_named(checkpoints, tmp_path):
    _, fp8 = checkpoints
    state = load_file(str(fp8 / "model.safetensors"))
    gone = "model.layers.2.mlp.experts.1.up_proj.weight_scale_inv"
    del state[gone]
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((fp8 / "config.json").read_text())
    with pytest.raises(CheckpointError, match=gone):
        load_model(tmp_path)


def test_other_quantization_methods_are_refused(tmp_path):
    with pytest.raises(QuantizationError, match="awq"):
        quantization_from_hf({"quantization_config": {"quant_method": "awq"}})
    with pytest.raises(QuantizationError, match="weight_block_size"):
        quantization_from_hf({"quantization_config": {"quant_method": "fp8", "weight_block_size": None}})
    with pytest.raises(QuantizationError, match="gptq"):
        load_model("tiny", load_format="dummy", quantization="gptq")


def test_dummy_fp8_never_holds_full_precision_linears(tmp_path):
    """The dummy build allocates every converted linear in FP8 directly (no bf16 copy of the model), and
    its weights are the bf16 dummy draws block-quantized."""
    config = {**preset_config("tiny"), **CONFIG, "dtype": "float32"}
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(tmp_path, load_format="dummy", seed=3)
    linear_weights = {
        n: p.dtype for n, p in model.named_parameters() if n.endswith(".weight") and p.dim() == 2
        and "embed" not in n and "conv1d" not in n
    }  # fmt: skip
    full = sorted(n for n, d in linear_weights.items() if d != FP8_DTYPE)
    assert full == sorted(
        [n for n in linear_weights if n.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))]
        + [f"model.layers.{i}.linear_attn.in_proj_ba.weight" for i in range(3)]
        + ["lm_head.weight"]
    )
    plain = load_model(tmp_path.parent / tmp_path.name, load_format="dummy", seed=3, quantization=None)
    assert isinstance(plain.model.layers[0].linear_attn.in_proj_qkvz, Fp8Linear)  # the config says fp8
    w = model.model.layers[0].mlp.experts[2].up_proj
    assert w.weight.dtype == FP8_DTYPE and w.weight_scale_inv.dtype == torch.float32
    logits = PagedHarness(model).step({0: PROMPT})[0]
    assert torch.isfinite(logits).all()


def test_real_preset_is_fp8(tmp_path):
    cfg = preset_config("qwen3-next-80b-a3b")
    quant = quantization_from_hf(cfg)
    assert quant is not None and quant.skips("model.layers.7.mlp.shared_expert_gate")
    assert not quant.skips("model.layers.7.mlp.experts.0.gate_proj")


def test_paged_prefix_hits_same_tokens_under_fp8(checkpoints):
    """The engine with prefix-cache hits (a shared prefix served from the cache) gives the tokens it gives
    without them, on the FP8 checkpoint."""
    _, fp8 = checkpoints
    prompts = [PROMPT + [100 + i] * 9 for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with flashstate.LLM(str(fp8), dtype="float32", enable_prefix_caching=False, **ENGINE) as llm:
        cold = [list(o.token_ids) for o in llm.generate(prompts, params)]
    with flashstate.LLM(str(fp8), dtype="float32", **ENGINE) as llm:
        first = llm.generate(prompts, params)  # fills the cache with the prompts' states
        outs = llm.generate(prompts, params)
    assert [list(o.token_ids) for o in first] == cold
    warm = [list(o.token_ids) for o in outs]
    assert all(o.num_cached_tokens > 0 for o in outs)
    assert warm == cold
