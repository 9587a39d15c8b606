"""Load an HF-format model directory: config.json, model.safetensors (or shards + index), tokenizer.

Names are matched exactly against the module tree; anything missing, unexpected, or of the wrong shape
or dtype raises `CheckpointError` naming the tensor — a model is never left partly random.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from flashstate.models.base import HybridForCausalLM
from flashstate.models.registry import build_model
from flashstate.models.shard_plan import Shard, ShardPlan, shard_spec
from flashstate.spec.hf_config import spec_from_hf


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
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for stored in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                name = model.checkpoint_name(stored)
                if name == tied:
                    continue
                if name not in params:
                    raise CheckpointError(f"unexpected tensor {stored!r} in {file.name}")
                if name in seen:
                    raise CheckpointError(f"tensor {name!r} appears more than once in the checkpoint")
                tensor = f.get_tensor(stored)
                if plan is not None:
                    tensor = plan.slice(name, tensor)
                target = params[name]
                if tuple(tensor.shape) != tuple(target.shape):
                    raise CheckpointError(
                        f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                    )
                if strict_dtype and tensor.dtype != target.dtype and tensor.is_floating_point():
                    raise CheckpointError(
                        f"tensor {name!r} has dtype {tensor.dtype}, expected {target.dtype}"
                    )
                with torch.no_grad():
                    target.copy_(model.from_checkpoint(name, tensor))
                seen.add(name)
    missing = sorted(set(params) - seen - ({tied} if tied else set()))
    if model.spec.tie_word_embeddings:
        missing = [m for m in missing if m != "lm_head.weight"]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing tensor {missing[0]!r}{more} in checkpoint")


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
) -> HybridForCausalLM:
    """Build the model named by `path/config.json` and load its safetensors.

    The checkpoint must store the dtype the model is built in (`dtype`, default the config's); pass
    `dtype` to cast after loading. With `shard`, build and load one tensor-parallel rank's share (its
    `spec` is that share's: heads and intermediate sizes divided by the world size).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(missing_model_message(str(path)))
    spec = spec_from_hf(path)
    files = checkpoint_files(path)
    plan = None
    if shard is not None and shard.world_size > 1:
        plan = ShardPlan(spec, shard)
        spec = shard_spec(spec, shard.world_size)
    with torch.device("meta"):
        model = build_model(spec)
    model = model.to_empty(device=device).to(spec.dtype)
    load_weights(model, files, plan=plan)
    model.post_load()
    if dtype is not None and dtype != spec.dtype:
        model = model.to(dtype)
    return model.eval()
