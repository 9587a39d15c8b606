"""Weight quantization of a checkpoint: the config.json `quantization_config` parsed, and which linear
layers a quantized model holds in FP8.

One method is served: block-wise FP8 (`quant_method: "fp8"`, the DeepSeek-V3 / Qwen3-*-FP8 layout):
    {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
     "modules_to_not_convert": [module names kept in the checkpoint dtype]}
Each quantized linear `X` stores `X.weight` (float8_e4m3fn [N, K]) and `X.weight_scale_inv` (fp32
[ceil(N/128), ceil(K/128)]). Anything else (another method, format, block size, static activation scales)
is refused naming the field. `--quantization fp8` asks for the same representation from a bf16 / fp32
checkpoint, quantized at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QUANTIZATION_METHODS = ("fp8",)  # vLLM's names, the ones served
BLOCK = 128
# Linear layers `--quantization fp8` (and a dummy FP8 model whose config lists no modules) keeps in the
# model dtype, as the published FP8 checkpoints do: the LM head, MoE routers and the shared-expert gate;
# and MLA's kv_b_proj, whose weight the absorbed attention reads as a matrix. A linear whose width or input
# is not a whole number of 128-blocks stays unquantized too (Qwen3-Next's 64-row in_proj_ba).
DEFAULT_NOT_CONVERTED_LEAVES = ("lm_head", "gate", "shared_expert_gate", "kv_b_proj")


class QuantizationError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Fp8BlockConfig:
    """Block-wise FP8 weights. `modules_to_not_convert`: module names (a name covers the modules under it)
    kept unquantized; None: the checkpoint's config lists none (the defaults above apply to a model built
    without a checkpoint)."""

    modules_to_not_convert: tuple[str, ...] | None = None
    block: tuple[int, int] = (BLOCK, BLOCK)

    def skips(self, module: str) -> bool:
        """Whether the config keeps linear `module` (module-tree name) unquantized."""
        return any(module == m or module.startswith(m + ".") for m in self.modules_to_not_convert or ())


def quantization_from_hf(config: dict[str, Any]) -> Fp8BlockConfig | None:
    """The checkpoint's weight quantization from its config.json dict (the text config's `quantization_config`
    when the model nests one); None for an unquantized checkpoint."""
    q = config.get("quantization_config")
    if q is None and isinstance(config.get("text_config"), dict):
        q = config["text_config"].get("quantization_config")
    if q is None:
        return None
    method = q.get("quant_method")
    if method != "fp8":
        raise QuantizationError(
            f"quantization_config.quant_method {method!r} is not supported (served: "
            f"{', '.join(QUANTIZATION_METHODS)}: block-wise FP8 with weight_scale_inv)"
        )
    if q.get("fmt", "e4m3") != "e4m3":
        raise QuantizationError(f"quantization_config.fmt {q['fmt']!r} is not supported (only e4m3)")
    if q.get("activation_scheme", "dynamic") != "dynamic":
        raise QuantizationError(
            f"quantization_config.activation_scheme {q['activation_scheme']!r} is not supported (only "
            "dynamic: activations are quantized per token group at run time)"
        )
    block = q.get("weight_block_size")
    if block is None or list(block) != [BLOCK, BLOCK]:
        raise QuantizationError(
            f"quantization_config.weight_block_size {block!r} is not supported (only [{BLOCK}, {BLOCK}]: "
            "per-tensor and per-channel FP8 checkpoints are not served)"
        )
    skip = q.get("modules_to_not_convert") or q.get("ignored_layers")
    return Fp8BlockConfig(tuple(skip) if skip is not None else None)


def resolve_quantization(checkpoint: Fp8BlockConfig | None, requested: str | None) -> Fp8BlockConfig | None:
    """The quantization a model is built with: the checkpoint's, or `requested` (`--quantization`; None:
    the checkpoint's). `fp8` on an FP8 checkpoint keeps the checkpoint's; on a bf16 / fp32 one the linear
    weights are quantized at load."""
    if requested is None:
        return checkpoint
    if requested not in QUANTIZATION_METHODS:
        raise QuantizationError(
            f"--quantization {requested!r} is not supported (one of: {', '.join(QUANTIZATION_METHODS)})"
        )
    return checkpoint or Fp8BlockConfig()


def converts_linear(quant: Fp8BlockConfig, module: str, out_features: int, in_features: int) -> bool:
    """Whether a model built with `quant` (and no checkpoint to say otherwise) holds linear `module` in FP8:
    not in the config's modules_to_not_convert (or, when it lists none, not an LM head, router or
    shared-expert gate), and both dims whole 128-blocks."""
    if quant.modules_to_not_convert is not None:
        if quant.skips(module):
            return False
    elif module.rpartition(".")[2] in DEFAULT_NOT_CONVERTED_LEAVES:
        return False
    return out_features % BLOCK == 0 and in_features % BLOCK == 0
