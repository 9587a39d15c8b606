"""The HF-directory loader: single and sharded safetensors load exactly; every bad input is one clear
error naming what is wrong, never a silently random model."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashstate.models.loader import CheckpointError, load_model
from flashstate.models.presets import materialize
from flashstate.spec.model_spec import UnsupportedModelError
from tests.harness import PagedHarness


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    materialize("tiny", path, seed=0)
    return path


def _copy(good, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(good, dst)
    return dst


def _edit_weights(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors")


def _logits(model):
    return PagedHarness(model).step({0: list(range(1, 40))})[0]


def test_sharded_checkpoint_loads_the_same_weights(good, tmp_path):
    path = _copy(good, tmp_path)
    tensors = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, path / file)
        weight_map.update(dict.fromkeys(keys, file))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    torch.testing.assert_close(_logits(load_model(path)), _logits(load_model(good)), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("model.norm.weight"), "missing tensor 'model.norm.weight'"),
        (lambda t: t.__setitem__("model.layers.0.extra.weight", torch.zeros(2)), "unexpected tensor"),
        (
            lambda t: t.__setitem__("model.norm.weight", torch.zeros(3)),
            r"'model.norm.weight' has shape \(3,\), expected",
        ),
        (
            lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"].to(torch.bfloat16)),
            "'model.norm.weight' has dtype torch.bfloat16, expected torch.float32",
        ),
    ],
    ids=["missing", "unexpected", "shape", "dtype"],
)
def test_bad_tensors_name_the_tensor(good, tmp_path, edit, message):
    path = _copy(good, tmp_path)
    _edit_weights(path, edit)
    with pytest.raises(CheckpointError, match=message):
        load_model(path)


def test_unsupported_architecture(good, tmp_path):
    path = _copy(good, tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="unsupported architecture.*LlamaForCausalLM"):
        load_model(path)


def test_missing_files(good, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nowhere")
    path = _copy(good, tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_model(path)
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "shard-1.safetensors"}})
    )
    with pytest.raises(CheckpointError, match="shard-1.safetensors"):
        load_model(path)
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(path)
