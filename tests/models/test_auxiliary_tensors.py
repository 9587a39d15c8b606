"""Checkpoint parts flashstate does not run (a multi-token-prediction head, a vision tower) are skipped with
one log line; any other unexpected tensor is still refused."""

import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashstate.models.loader import CheckpointError, load_model
from flashstate.models.presets import materialize
from tests.harness import PagedHarness


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return materialize("tiny", tmp_path_factory.mktemp("good"), seed=0)


def _with(good, tmp_path, extra):
    path = tmp_path / "model"
    shutil.copytree(good, path)
    tensors = load_file(path / "model.safetensors") | extra
    save_file(tensors, path / "model.safetensors")
    return path


def _logits(model):
    return PagedHarness(model).step({0: list(range(1, 30))})[0]


def test_mtp_and_vision_tensors_are_skipped_with_one_log_line(good, tmp_path, caplog):
    extra = {
        "mtp.fc.weight": torch.zeros(128, 256),
        "mtp.layers.0.mlp.experts.0.up_proj.weight": torch.zeros(4, 128),
        "mtp.norm.weight": torch.zeros(128),
        "model.visual.blocks.0.attn.qkv.weight": torch.zeros(6, 2),
    }
    path = _with(good, tmp_path, extra)
    with caplog.at_level(logging.INFO, logger="flashstate"):
        model = load_model(path)
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "mtp.* (3)" in lines[0] and "no MTP module" in lines[0]
    assert "model.visual.* (1)" in lines[0] and "vision tower" in lines[0]
    torch.testing.assert_close(_logits(model), _logits(load_model(good)), rtol=0, atol=0)


def test_a_clean_checkpoint_logs_no_skips(good, caplog):
    with caplog.at_level(logging.INFO, logger="flashstate"):
        load_model(good)
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]


@pytest.mark.parametrize(
    "name", ["model.layers.0.extra.weight", "vision_tower.blocks.0.weight", "mtpx.fc.weight", "visual.x"]
)
def test_unknown_tensors_are_still_refused(good, tmp_path, name):
    path = _with(good, tmp_path, {"mtp.fc.weight": torch.zeros(2), name: torch.zeros(2)})
    with pytest.raises(CheckpointError, match=f"unexpected tensor '{name}'"):
        load_model(path)
