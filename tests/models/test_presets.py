"""Model presets: configs, parameter counts, random-weight directories and the cached default model."""

import json
import os
import threading

import pytest
import torch
from safetensors.torch import load_file

from flashstate.default_tokenizer import DEFAULT_VOCAB_SIZE, IM_END_ID
from flashstate.models import presets
from flashstate.models.loader import load_model
from flashstate.models.param_count import count_parameters
from flashstate.models.presets import (
    default_model_dir,
    materialize,
    materialize_config,
    preset_dir,
    random_weights,
)
from flashstate.models.registry import build_model
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.preset_configs import DEFAULT_PRESET, list_presets, preset_config
from flashstate.tokenizer import Tokenizer
from tests.harness import PagedHarness, rel_err

TINY = ["tiny", "tiny-nemotron-h", "tiny-kimi-linear"]
BENCH = ["qwen3-next-2b", "nemotron-h-2b", "kimi-linear-2b"]

# Variants that exercise the counting of paths the presets leave out (MoE, tied embeddings, biases).
VARIANTS = {
    "qwen3-next-moe-tied": (
        "tiny",
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            mlp_only_layers=[0],
            tie_word_embeddings=True,
        ),
    ),
    "nemotron-h-moe": (
        "tiny-nemotron-h",
        dict(
            layers_block_type=["linear_attention", "moe", "full_attention", "mlp"],
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=48,
            n_shared_experts=1,
            mamba_proj_bias=True,
            use_conv_bias=False,
        ),
    ),
    "nemotron-h-latent-moe": (
        "tiny-nemotron-h",
        dict(
            layers_block_type=["linear_attention", "moe", "full_attention", "moe"],
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=48,
            n_shared_experts=1,
            moe_latent_size=64,
            mlp_bias=True,
        ),
    ),
    "kimi-linear-q-lora": ("tiny-kimi-linear", dict(q_lora_rank=48, tie_word_embeddings=True)),
}


def _variant(name: str) -> dict:
    base, overrides = VARIANTS[name]
    return {**preset_config(base), **overrides}


def test_list_and_unknown():
    assert set(TINY + BENCH) <= set(list_presets())
    with pytest.raises(KeyError, match="unknown model preset 'nope'"):
        preset_config("nope")
    config = preset_config("tiny")
    config["hidden_size"] = 1
    assert preset_config("tiny")["hidden_size"] == 128  # a copy each time


@pytest.mark.parametrize("name", TINY + BENCH)
def test_presets_parse(name):
    config = preset_config(name)
    spec = spec_from_hf(config)
    assert config["architectures"] == [spec.architecture] and config["model_type"]
    assert spec.dtype == (torch.float32 if name in TINY else torch.bfloat16)
    assert spec.eos_token_ids == (IM_END_ID,)
    assert spec.vocab_size >= DEFAULT_VOCAB_SIZE
    assert spec.max_position_embeddings >= 131072
    assert spec.attention_layer_ids and spec.linear_layer_ids
    if spec.architecture != "NemotronHForCausalLM":  # one full-attention layer in every four
        assert spec.attention_layer_ids == list(range(3, spec.num_layers, 4))
    json.dumps(config)  # serialisable as config.json


def test_tiny_is_the_default_tokenizer_size():
    for name in TINY:
        assert preset_config(name)["vocab_size"] == DEFAULT_VOCAB_SIZE


# The counts the module docstring's table quotes.
COUNTS = {
    "tiny": (1_383_736, 859_448),
    "tiny-nemotron-h": (1_439_456, 915_168),
    "tiny-kimi-linear": (2_869_464, 2_345_176),
    "qwen3-next-2b": (2_223_415_680, 1_601_085_824),
    "nemotron-h-2b": (1_840_518_912, 1_303_648_000),
    "kimi-linear-2b": (2_294_169_408, 1_623_080_768),
}


@pytest.mark.parametrize("name", TINY + BENCH)
def test_parameter_counts(name):
    spec = spec_from_hf(preset_config(name))
    assert (count_parameters(spec), count_parameters(spec, embeddings=False)) == COUNTS[name]
    if name in BENCH:
        assert 1.6e9 <= count_parameters(spec) <= 2.6e9


@pytest.mark.parametrize("name", TINY + BENCH + list(VARIANTS))
def test_parameter_count_matches_transformers(name):
    import transformers
    config = _variant(name) if name in VARIANTS else preset_config(name)
    hf_config = transformers.AutoConfig.for_model(**config)
    for key, value in config.items():  # every key we write means to HF what we mean
        got = getattr(hf_config, key)
        got = str(got).removeprefix("torch.") if key == "dtype" else got
        assert got == value or list(got) == value, key
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert count_parameters(spec_from_hf(config)) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("name", TINY + BENCH + list(VARIANTS))
def test_parameter_count_matches_our_models(name):
    spec = spec_from_hf(_variant(name) if name in VARIANTS else preset_config(name))
    with torch.device("meta"):
        model = build_model(spec)
    assert count_parameters(spec) == sum(p.numel() for p in model.parameters())
    embeddings = spec.vocab_size * spec.hidden_size * (1 if spec.tie_word_embeddings else 2)
    assert count_parameters(spec, embeddings=False) == count_parameters(spec) - embeddings


def test_random_weights_are_deterministic_and_follow_hf_init():
    spec = spec_from_hf(preset_config("tiny"))
    a, b, c = random_weights(spec, 0), random_weights(spec, 0), random_weights(spec, 1)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert abs(a["model.embed_tokens.weight"].std().item() - 0.02) < 1e-3
    # Qwen3-Next RMSNorms are zero-centred (x̂·(1 + w)); the Gated DeltaNet output norm is not.
    assert not a["model.norm.weight"].any() and not a["model.layers.3.self_attn.q_norm.weight"].any()
    assert (a["model.layers.0.linear_attn.norm.weight"] == 1).all()
    assert (a["model.layers.0.linear_attn.dt_bias"] == 1).all()
    a_log = a["model.layers.0.linear_attn.A_log"].exp()
    assert ((a_log >= 0.01) & (a_log <= 16)).all()


def test_random_weights_mamba2_and_kda_init():
    nem = random_weights(spec_from_hf(preset_config("tiny-nemotron-h")), 0)
    heads = preset_config("tiny-nemotron-h")["mamba_num_heads"]
    mixer = "backbone.layers.0.mixer."
    assert torch.allclose(nem[mixer + "A_log"].exp(), torch.arange(1.0, heads + 1))
    assert (nem[mixer + "D"] == 1).all() and not nem[mixer + "conv1d.bias"].any()
    dt = torch.nn.functional.softplus(nem[mixer + "dt_bias"])
    assert ((dt > 0.99e-3) & (dt < 0.101)).all()
    assert (nem[mixer + "norm.weight"] == 1).all() and (nem["backbone.norm_f.weight"] == 1).all()
    kimi = random_weights(spec_from_hf(preset_config("tiny-kimi-linear")), 0)
    dt_bias = [v for k, v in kimi.items() if k.endswith("dt_bias")][0]
    assert (
        (torch.nn.functional.softplus(dt_bias) > 0.99e-3) & (torch.nn.functional.softplus(dt_bias) < 0.101)
    ).all()
    bias = [v for k, v in kimi.items() if k.endswith("e_score_correction_bias")]
    assert bias and not any(b.any() for b in bias)


def test_tied_embeddings_drop_the_head(tmp_path):
    config = _variant("qwen3-next-moe-tied")
    materialize_config(config, tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    model = load_model(tmp_path)
    assert torch.isfinite(PagedHarness(model).step({0: [1, 2, 3]})[0]).all()


@pytest.mark.parametrize("name", TINY)
def test_materialized_preset_loads_and_runs(tmp_path, name):
    path = materialize(name, tmp_path, seed=3)
    assert {p.name for p in path.iterdir()} == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert json.loads((path / "config.json").read_text()) == json.loads(json.dumps(preset_config(name)))
    model = load_model(path)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(model.spec)
    tok = Tokenizer.from_dir(path)
    ids = tok.encode(
        tok.apply_chat_template([{"role": "user", "content": "Hello!"}]), add_special_tokens=False
    )
    logits = PagedHarness(model).step({0: ids})[0]
    assert logits.shape == (len(ids), DEFAULT_VOCAB_SIZE) and torch.isfinite(logits).all()
    assert logits.std() > 0.05  # a random model, not a zero one


@pytest.mark.parametrize("name", TINY)
def test_materialized_preset_matches_transformers(tmp_path, name):
    """The directory is a normal HF model directory: transformers loads every tensor and agrees."""
    import transformers
    path = materialize(name, tmp_path)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    assert not any(info.values()), info
    ids = list(range(5, 70))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    assert rel_err(PagedHarness(load_model(path)).step({0: ids})[0], ref) < 1e-5


def test_preset_dir_is_cached_and_atomic(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSTATE_HOME", str(tmp_path))
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(preset_dir("tiny-nemotron-h"))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len(set(results)) == 1
    path = results[0]
    assert path.parent == tmp_path / "models" and path.name.startswith("tiny-nemotron-h-")
    assert os.listdir(path.parent) == [path.name]  # no temporary copies left behind
    assert (
        path / "model.safetensors"
    ).stat().st_mode & 0o777 == 0o644 and path.stat().st_mode & 0o777 == 0o755
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert preset_dir("tiny-nemotron-h") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rewritten
    assert preset_dir("tiny-nemotron-h", seed=1) != path
    load_model(path)


def test_preset_dir_yields_to_a_writer_that_finished_first(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSTATE_HOME", str(tmp_path))
    real = presets.materialize_config

    def racing(config, directory, seed=0):  # another process renames its copy in while we write ours
        real(config, directory, seed)
        final = tmp_path / "models" / f"tiny-{presets._fingerprint(config, seed)}"
        real(config, final, seed)
        return directory

    monkeypatch.setattr(presets, "materialize_config", racing)
    path = preset_dir("tiny")
    assert os.listdir(tmp_path / "models") == [path.name]
    load_model(path)


def test_default_model_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHSTATE_HOME", str(tmp_path))
    path = default_model_dir()
    assert path.name.startswith(DEFAULT_PRESET + "-")
    assert spec_from_hf(path).architecture == "Qwen3NextForCausalLM"
    assert Tokenizer.from_dir(path).vocab_size == DEFAULT_VOCAB_SIZE
