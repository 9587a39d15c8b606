"""Load an HF-format model directory: config.json, model.safetensors (or shards + index), tokenizer.

Names are matched exactly against the module tree; anything missing, unexpected, or of the wrong shape
or dtype raises `CheckpointError` naming the tensor — a model is never left partly random. Two kinds of
stored tensor are not module-tree names and are still accepted:

- auxiliary parts flashstate does not run (`AUXILIARY_PREFIXES`: the multi-token-prediction head, a
  multimodal checkpoint's vision tower): skipped, with one log line naming each prefix and its count;
- an MoE layer's experts stored fused (transformers 5's layout: `...experts.gate_up_proj` [E, 2·I, H],
  gate rows first, and `...experts.down_proj` [E, H, I]): split into the per-expert parameters.

Block-FP8 checkpoints (config.json `quantization_config` with `quant_method: "fp8"`, spec/quantization.py):
every linear whose `.weight` is stored as float8_e4m3fn is built as an `Fp8Linear` and loads its
`.weight_scale_inv` too (a missing scale is a missing tensor). `quantization="fp8"` on a bf16 / fp32
checkpoint builds the linears `converts_linear` picks in FP8 and quantizes each weight as it is read
(`quantize_block`, the quantizer that writes FP8 checkpoints). Loading logs one line per shard file.

`load_format="dummy"` reads no weights: the model named by a directory holding config.json (tokenizer
files optional) or by a preset name is built on the device and filled with random weights
(models/random_init.py), deterministic per seed.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from flashstate.config import LoadFormat, Quantization
from flashstate.default_tokenizer import (
    DEFAULT_CHAT_TEMPLATE,
    DEFAULT_SPECIAL_TOKENS,
    build_default_tokenizer,
)
from flashstate.layers.fp8_linear import SCALE_SUFFIX, convert_linears, quantize_linears
from flashstate.models.base import HybridForCausalLM
from flashstate.models.random_init import randomize_
from flashstate.models.registry import build_meta_model
from flashstate.models.shard_plan import Shard, ShardPlan, shard_spec
from flashstate.ops.fp8.block_quant import FP8_DTYPE, quantize_block
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.model_spec import ModelSpec
from flashstate.spec.preset_configs import PRESETS, preset_config
from flashstate.spec.quantization import (
    Fp8BlockConfig,
    quantization_from_hf,
    resolve_quantization,
)
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
    model: HybridForCausalLM,
    files: list[Path],
    strict_dtype: bool = True,
    plan: ShardPlan | None = None,
    quantize: bool = False,
) -> None:
    """Copy every checkpoint tensor into the module tree; with `plan`, only this rank's share of each.
    `quantize`: an FP8 parameter may be given a full-precision weight, block-quantized as it is copied."""
    params = dict(model.named_parameters())
    params.update((k, v) for k, v in model.named_buffers() if k in model.state_dict())
    tied = "lm_head.weight" if model.spec.tie_word_embeddings else None
    seen: set[str] = set()
    skipped: Counter[str] = Counter()
    for i, file in enumerate(files):
        start, count, size = time.perf_counter(), 0, 0
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
                    tensor = get()
                    count, size = count + 1, size + tensor.numel() * tensor.element_size()
                    if quantize and _quantizes(params, target_name, tensor):
                        _copy_quantized(model, params, target_name, tensor, seen, plan)
                    else:
                        _copy_in(model, params[target_name], target_name, tensor, seen, strict_dtype, plan)
        logger.info(
            "checkpoint shard %d/%d %s: %d tensors, %.2f GB in %.1f s",
            i + 1, len(files), file.name, count, size / 1e9, time.perf_counter() - start,
        )  # fmt: skip
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


def _quantizes(params: dict, name: str, tensor: Tensor) -> bool:
    """Whether checkpoint tensor `name` is a full-precision weight of a block-FP8 parameter."""
    return params[name].dtype == FP8_DTYPE and tensor.dtype != FP8_DTYPE and name.endswith(".weight")


def _copy_quantized(
    model: HybridForCausalLM, params: dict, name: str, tensor: Tensor, seen: set[str], plan: ShardPlan | None
) -> None:
    """Block-quantize full-precision weight `name` into its FP8 parameter and its `weight_scale_inv`, each
    then put in the layout the model holds (`from_checkpoint`: both in the checkpoint's row order until
    then, as an FP8 checkpoint stores them)."""
    scale_name = name.removesuffix("weight") + SCALE_SUFFIX
    if scale_name in seen:
        raise CheckpointError(f"tensor {scale_name!r} appears in a checkpoint quantized at load")
    if plan is not None:
        tensor = plan.slice(name, tensor)
    target = params[name]
    if tuple(tensor.shape) != tuple(target.shape):
        raise CheckpointError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
        )
    q, scale = quantize_block(tensor)
    _copy_in(model, target, name, q, seen, True, None)
    _copy_in(model, params[scale_name], scale_name, scale, seen, True, None)


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
    scale = name.endswith("." + SCALE_SUFFIX)  # block scales: fp32 in the model, any float dtype stored
    if strict_dtype and tensor.dtype != target.dtype and tensor.is_floating_point() and not scale:
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
    quantization: Quantization | None = None,
) -> HybridForCausalLM:
    """Build the model named by `path/config.json` and load its safetensors.

    The checkpoint must store the dtype the model is built in (`dtype`, default the config's); pass
    `dtype` to cast after loading. With `shard`, build and load one tensor-parallel rank's share (its
    `spec` is that share's: heads and intermediate sizes divided by the world size). With
    `load_format="dummy"`, `path` may also be a preset name and no weights are read: random ones from
    `seed` are drawn on `device`.

    `quantization` (`--quantization`; None: the checkpoint's `quantization_config`): "fp8" builds the
    linear layers in block FP8; an FP8 checkpoint's are those it stores in FP8, a full-precision
    checkpoint's are quantized as they are read, a dummy model's are drawn in full precision one tensor at
    a time and quantized (the model never exists in full precision).
    """
    if load_format == "dummy":
        config = dummy_config(path)
        files = []
    else:
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(missing_model_message(str(path)))
        config = json.loads((path / "config.json").read_text())
        files = checkpoint_files(path)
    spec = spec_from_hf(config if load_format == "dummy" else path)
    quant = resolve_quantization(quantization_from_hf(config), quantization)
    full_spec, plan = spec, None
    if shard is not None and shard.world_size > 1:
        if quant is not None:
            raise CheckpointError(
                "FP8 weights with tensor parallelism (--tensor-parallel-size > 1) are not supported"
            )
        plan = ShardPlan(spec, shard)
        spec = shard_spec(spec, shard.world_size)
    model, quantize_on_load = _build_empty(spec, device, quant, files)
    if load_format == "dummy":
        randomize_(model, seed, full_spec, plan)
        logger.info(
            "load format dummy: %s with random weights (seed %d)%s, nothing read",
            spec.architecture, seed, " in block FP8" if quant is not None else "",
        )  # fmt: skip
    else:
        load_weights(model, files, plan=plan, quantize=quantize_on_load)
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


def _build_empty(
    spec: ModelSpec, device: torch.device | str, quant: Fp8BlockConfig | None = None, files: list[Path] = ()
) -> tuple[HybridForCausalLM, bool]:
    """The model's module tree with uninitialised tensors of `spec.dtype` on `device` (cast while still on
    the meta device, so a bf16 model never takes fp32 memory), and whether its FP8 weights are quantized
    at load. With `quant`, linears are `Fp8Linear`s: those `files` store in FP8 if any, else (a
    full-precision checkpoint, or none: dummy) those `converts_linear` picks."""
    model = build_meta_model(spec).to(spec.dtype)
    quantize_on_load = False
    if quant is not None:
        stored = _stored_fp8(model, files)
        if stored:
            chosen = quantize_linears(model, lambda name, _: name in stored)
            if unknown := sorted(stored - set(chosen)):
                raise CheckpointError(
                    f"tensor {unknown[0]}.weight is stored in FP8 but is not a linear layer's weight"
                )
        else:
            chosen = convert_linears(model, quant)
            quantize_on_load = bool(files)
        logger.info("block FP8: %d linear layers", len(chosen))
    # Module.to_empty's empty_like of a meta tensor runs a Python reference kernel (its first call imports
    # torch's symbolic-shapes machinery, ~1 s); a plain factory call does not
    empty = model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    return empty, quantize_on_load


def _stored_fp8(model: HybridForCausalLM, files: list[Path]) -> set[str]:
    """Module-tree names of the linears whose weight `files` store as float8_e4m3fn (headers only)."""
    found = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for stored in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if stored.endswith(".weight") and f.get_slice(stored).get_dtype() == "F8_E4M3":
                    found.add(model.checkpoint_name(stored).removesuffix(".weight"))
    return found
