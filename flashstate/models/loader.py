"""Load an HF-format model directory: config.json, model.safetensors (or shards + index), tokenizer.

Names are matched exactly against the module tree; anything missing, unexpected, or of the wrong shape
or dtype raises `CheckpointError` naming the tensor — a model is never left partly random. Two kinds of
stored tensor are not module-tree names and are still accepted:

- auxiliary parts flashstate does not run (`AUXILIARY_PREFIXES`: the multi-token-prediction head, a
  multimodal checkpoint's vision tower): skipped, with one log line naming each prefix and its count;
- an MoE layer's experts stored fused (transformers 5's layout: `...experts.gate_up_proj` [E, 2·I, H],
  gate rows first, and `...experts.down_proj` [E, H, I]): split into the per-expert parameters.

`load_format="dummy"` reads no weights: the model named by a directory holding config.json (tokenizer
files optional) or by a preset name is built on the device and filled with random weights
(models/random_init.py), deterministic per seed.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from flashstate.config import LoadFormat
from flashstate.default_tokenizer import (
    DEFAULT_CHAT_TEMPLATE,
    DEFAULT_SPECIAL_TOKENS,
    build_default_tokenizer,
)
from flashstate.models.base import HybridForCausalLM
from flashstate.models.random_init import randomize_
from flashstate.models.registry import build_model
from flashstate.models.shard_plan import Shard, ShardPlan, shard_spec
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.model_spec import ModelSpec
from flashstate.spec.preset_configs import PRESETS, preset_config
from flashstate.tokenizer import Tokenizer

logger = logging.getLogger("flashstate")

# Checkpoint parts no flashstate model has a module for: prefix → what it is.
AUXILIARY_PREFIXES = {
    "mtp.": "multi-token prediction head (flashstate has no MTP module: no speculative decoding)",
    "model.visual.": "vision tower (served text-only)",
}
_FUSED_EXPERTS = re.compile(r"^(?P<block>.+\.experts)\.(?P<part>gate_up_proj|down_proj)$")


class CheckpointError(ValueError):
    pass


def checkpoint_files(path: Path) -> list[Path]:
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: not a safetensors index ({e})") from e
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) that do not exist: {', '.join(missing)}")
        return files
    raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {path}")


def load_weights(
    model: HybridForCausalLM, files: list[Path], strict_dtype: bool = True, plan: ShardPlan | None = None
) -> None:
    """Copy every checkpoint tensor into the module tree; with `plan`, only this rank's share of each."""
    params = dict(model.named_parameters())
    params.update((k, v) for k, v in model.named_buffers() if k in model.state_dict())
    tied = "lm_head.weight" if model.spec.tie_word_embeddings else None
    seen: set[str] = set()
    skipped: Counter[str] = Counter()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for stored in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                name = model.checkpoint_name(stored)
                if name == tied:
                    continue
                if name in params:
                    parts = [(name, lambda stored=stored: f.get_tensor(stored))]
                elif (fused := _unfused_names(name, params)) is not None:
                    parts = _split_fused(name, fused, f.get_tensor(stored))
                elif (prefix := _auxiliary(stored)) is not None:
                    skipped[prefix] += 1
                    continue
                else:
                    raise CheckpointError(f"unexpected tensor {stored!r} in {file.name}")
                for target_name, get in parts:
                    _copy_in(model, params[target_name], target_name, get(), seen, strict_dtype, plan)
    if skipped:
        logger.info(
            "checkpoint: skipped tensors flashstate does not run: %s",
            "; ".join(f"{p}* ({n}): {AUXILIARY_PREFIXES[p]}" for p, n in sorted(skipped.items())),
        )
    missing = sorted(set(params) - seen - ({tied} if tied else set()))
    if model.spec.tie_word_embeddings:
        missing = [m for m in missing if m != "lm_head.weight"]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing tensor {missing[0]!r}{more} in checkpoint")


def _auxiliary(stored: str) -> str | None:
    return next((p for p in AUXILIARY_PREFIXES if stored.startswith(p)), None)


def _unfused_names(name: str, params: dict) -> list[list[str]] | None:
    """For a fused expert tensor whose per-expert parameters exist: per expert, the parameter names its
    rows go to (gate then up, or down); else None."""
    m = _FUSED_EXPERTS.match(name)
    if m is None:
        return None
    leaves = ["gate_proj", "up_proj"] if m["part"] == "gate_up_proj" else ["down_proj"]
    names, e = [], 0
    while all(f"{m['block']}.{e}.{leaf}.weight" in params for leaf in leaves):
        names.append([f"{m['block']}.{e}.{leaf}.weight" for leaf in leaves])
        e += 1
    return names or None


def _split_fused(name: str, targets: list[list[str]], tensor: Tensor) -> list[tuple[str, object]]:
    if tensor.dim() != 3 or tensor.shape[0] != len(targets):
        raise CheckpointError(
            f"fused expert tensor {name!r} has shape {tuple(tensor.shape)}, expected [{len(targets)}, ...]"
        )
    out = []
    for e, names in enumerate(targets):
        for leaf, rows in zip(names, tensor[e].chunk(len(names), dim=0), strict=True):
            out.append((leaf, lambda rows=rows: rows))
    return out


def _copy_in(
    model: HybridForCausalLM,
    target: Tensor,
    name: str,
    tensor: Tensor,
    seen: set[str],
    strict_dtype: bool,
    plan: ShardPlan | None,
) -> None:
    if name in seen:
        raise CheckpointError(f"tensor {name!r} appears more than once in the checkpoint")
    if plan is not None:
        tensor = plan.slice(name, tensor)
    if tuple(tensor.shape) != tuple(target.shape):
        raise CheckpointError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
        )
    if strict_dtype and tensor.dtype != target.dtype and tensor.is_floating_point():
        raise CheckpointError(f"tensor {name!r} has dtype {tensor.dtype}, expected {target.dtype}")
    with torch.no_grad():
        target.copy_(model.from_checkpoint(name, tensor))
    seen.add(name)


def missing_model_message(model: str) -> str:
    """Why `model` cannot be loaded, with the download command when it looks like a Hugging Face id."""
    message = f"model directory {model} does not exist"
    parts = model.split("/")
    if len(parts) == 2 and all(parts) and not model.startswith((".", "~")):
        message += (
            f"; flashstate loads local HF-format checkpoints: to serve the Hugging Face model {model}, "
            f"download it first (`hf download {model} --local-dir DIR`) and pass DIR"
        )
    return message


def load_model(
    path: str | Path,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    shard: Shard | None = None,
    load_format: LoadFormat = "auto",
    seed: int = 0,
) -> HybridForCausalLM:
    """Build the model named by `path/config.json` and load its safetensors.

    The checkpoint must store the dtype the model is built in (`dtype`, default the config's); pass
    `dtype` to cast after loading. With `shard`, build and load one tensor-parallel rank's share (its
    `spec` is that share's: heads and intermediate sizes divided by the world size). With
    `load_format="dummy"`, `path` may also be a preset name and no weights are read: random ones from
    `seed` are drawn on `device`.
    """
    if load_format == "dummy":
        spec = spec_from_hf(dummy_config(path))
    else:
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(missing_model_message(str(path)))
        spec = spec_from_hf(path)
        files = checkpoint_files(path)
    full_spec, plan = spec, None
    if shard is not None and shard.world_size > 1:
        plan = ShardPlan(spec, shard)
        spec = shard_spec(spec, shard.world_size)
    model = _build_empty(spec, device)
    if load_format == "dummy":
        randomize_(model, seed, full_spec, plan)
        logger.info(
            "load format dummy: %s with random weights (seed %d), nothing read", spec.architecture, seed
        )
    else:
        load_weights(model, files, plan=plan)
    model.post_load()
    if dtype is not None and dtype != spec.dtype:
        model = model.to(dtype)
    return model.eval()


def dummy_config(model: str | Path) -> dict:
    """The config.json dict a dummy load builds: preset `model`, or the config.json in directory `model`
    (which needs no weights)."""
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in {path}")
        return json.loads((path / "config.json").read_text())
    if str(model) in PRESETS:
        return preset_config(str(model))
    raise FileNotFoundError(
        f"{model} is neither a directory holding config.json nor a preset ({', '.join(PRESETS)})"
    )


def load_tokenizer(
    model: str | Path, tokenizer: str | Path | None = None, load_format: LoadFormat = "auto"
) -> Tokenizer:
    """The tokenizer in `tokenizer`, else in the model directory. A dummy load whose model has no tokenizer
    files (a preset name, or a directory holding only config.json) gets the embedded default tokenizer."""
    source = Path(tokenizer or model)
    if load_format == "dummy" and tokenizer is None and not (source / "tokenizer.json").is_file():
        logger.info(
            "load format dummy: %s has no tokenizer.json, using the embedded default tokenizer", model
        )
        special = {"eos_token": DEFAULT_SPECIAL_TOKENS[2], "pad_token": DEFAULT_SPECIAL_TOKENS[0]}
        return Tokenizer(build_default_tokenizer(), DEFAULT_CHAT_TEMPLATE, special)
    return Tokenizer.from_dir(source)


def _build_empty(spec: ModelSpec, device: torch.device | str) -> HybridForCausalLM:
    """The model's module tree with uninitialised tensors of `spec.dtype` on `device` (cast while still on
    the meta device, so a bf16 model never takes fp32 memory)."""
    with torch.device("meta"):
        model = build_model(spec).to(spec.dtype)
    return model.to_empty(device=device)
