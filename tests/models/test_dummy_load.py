"""`--load-format dummy`: any supported config (a directory holding only config.json, or a preset name) built
with random weights on the device, deterministic per seed, nothing read from disk; the real-size presets
exist only this way."""

import json

import pytest
import torch

from flashstate.models import loader
from flashstate.models.loader import load_model, load_tokenizer
from flashstate.models.param_count import count_active_parameters, count_parameters
from flashstate.models.presets import materialize, materialize_config, preset_dir
from flashstate.models.registry import build_model
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.preset_configs import DUMMY_ONLY, preset_config
from tests.harness import PagedHarness
from tests.server.conftest import running_server

REAL = ["qwen3-next-80b-a3b", "qwen3.6-35b-a3b", "nemotron-3-nano-30b-a3b", "kimi-linear-48b-a3b"]
# (total, active) parameters: the module docstrings' tables
REAL_COUNTS = {
    "qwen3-next-80b-a3b": (79.67e9, 3.87e9),
    "qwen3.6-35b-a3b": (34.66e9, 3.45e9),
    "nemotron-3-nano-30b-a3b": (31.58e9, 3.58e9),
    "kimi-linear-48b-a3b": (49.12e9, 3.48e9),
}
# A shrunk Qwen3.6 (the multimodal MoE config, layout kept) and the tiny presets
SHRUNK_QWEN3_6 = preset_config("qwen3.6-35b-a3b")
SHRUNK_QWEN3_6["text_config"] |= dict(
    vocab_size=2048, hidden_size=64, num_hidden_layers=8,
    layer_types=SHRUNK_QWEN3_6["text_config"]["layer_types"][:8], num_attention_heads=4, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    dtype="float32",
)  # fmt: skip
SHRUNK_QWEN3_6["text_config"]["rope_parameters"] |= {"mrope_section": [2, 1, 1]}


@pytest.fixture
def no_disk_reads(monkeypatch):
    """Opening any safetensors file fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a dummy load opened a checkpoint file")

    monkeypatch.setattr(loader, "safe_open", refuse)
    monkeypatch.setattr(loader, "checkpoint_files", refuse)


def _config_dir(tmp_path, config):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("config", ["tiny", "tiny-nemotron-h", "tiny-kimi-linear", "qwen3.6-shrunk"])
def test_config_only_dir_is_deterministic_per_seed(tmp_path, no_disk_reads, config):
    cfg = SHRUNK_QWEN3_6 if config == "qwen3.6-shrunk" else preset_config(config)
    path = _config_dir(tmp_path, cfg)
    a = load_model(path, load_format="dummy", seed=0)
    b, c = (
        _state(load_model(path, load_format="dummy", seed=0)),
        _state(load_model(path, load_format="dummy", seed=1)),
    )
    state = _state(a)
    assert state.keys() == b.keys() and all(torch.equal(state[k], b[k]) for k in state)
    assert any(not torch.equal(state[k], c[k]) for k in state if state[k].is_floating_point())
    assert sum(p.numel() for p in a.parameters()) == count_parameters(a.spec)
    # HF's init: normal(0, 0.02) projections, the family's norms and gates
    emb = a.state_dict()[
        next(k for k in state if k.endswith("embed_tokens.weight") or k.endswith("embeddings.weight"))
    ]
    assert abs(emb.std().item() - 0.02) < 2e-3
    tokens = list(range(5, 60))
    logits = PagedHarness(a).step({0: tokens})[0]
    assert logits.shape == (len(tokens), a.spec.vocab_size) and torch.isfinite(logits).all()
    assert 1e-3 < logits.std().item() < 10  # a random model at HF's scale: neither zero nor blown up


def test_dummy_on_cpu_equals_the_materialized_preset(tmp_path):
    """The preset checkpoints are the same draws: dummy and disk give bit-identical models."""
    for name in ("tiny", "tiny-kimi-linear"):
        disk = load_model(materialize(name, tmp_path / name, seed=4))
        dummy = load_model(name, load_format="dummy", seed=4)
        a, b = _state(disk), _state(dummy)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_preset_name_and_device(no_disk_reads):
    model = load_model("tiny-nemotron-h", load_format="dummy", seed=2, device="cpu")
    assert model.spec.architecture == "NemotronHForCausalLM"
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    tokenizer = load_tokenizer("tiny-nemotron-h", load_format="dummy")  # the embedded one
    assert tokenizer.vocab_size == model.spec.vocab_size and tokenizer.eos_token_ids


def test_bad_dummy_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a directory holding config.json nor a preset"):
        load_model(tmp_path / "nowhere", load_format="dummy")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path, load_format="dummy")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model("tiny")  # without dummy, a preset name is not a model directory


@pytest.mark.parametrize("name", REAL)
def test_real_presets(tmp_path, name):
    """Their counts are the tables', their module trees build, and they are never written to disk."""
    assert name in DUMMY_ONLY
    spec = spec_from_hf(preset_config(name))
    total, active = REAL_COUNTS[name]
    assert round(count_parameters(spec) / 1e7) == round(total / 1e7)
    assert round(count_active_parameters(spec) / 1e7) == round(active / 1e7)
    with torch.device("meta"):
        model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(spec)
    with pytest.raises(ValueError, match="never written to disk"):
        materialize(name, tmp_path / "m")
    with pytest.raises(ValueError, match="never written to disk"):
        preset_dir(name)
    with pytest.raises(ValueError, match="--load-format dummy"):
        materialize_config(preset_config(name), tmp_path / "c")
    assert not (tmp_path / "m").exists() and not (tmp_path / "c").exists()


def test_server_serves_a_config_only_dir(tmp_path):
    model = _config_dir(tmp_path / "model", preset_config("tiny-kimi-linear"))
    args = ["--load-format", "dummy", "--model", str(model), "--seed", "3", "--device", "cpu"]
    args += ["--prefill-cost-coefficients", "1e-5", "1e-10", "--max-model-len", "4096"]
    with running_server(tmp_path, args) as server:
        client = server.client()
        reply = client.completions.create(model=client.models.list().data[0].id, prompt="Hello", max_tokens=8)
        assert reply.choices[0].finish_reason in ("length", "stop") and reply.usage.completion_tokens >= 1
        assert "load format dummy" in server.log_tail(20000)
