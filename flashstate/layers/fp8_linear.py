"""A linear layer holding block-wise FP8 weights, the parameters of the published FP8 checkpoints:
`weight` (float8_e4m3fn [out, in]) and `weight_scale_inv` (fp32 [ceil(out/128), ceil(in/128)]), plus an
optional `bias` in the model dtype. A quantized model is the family's module tree with its chosen
`nn.Linear` children replaced by this (`quantize_linears`), on the meta device before any weight exists,
so the HF names stay and no full-precision copy is ever made.

Moves keep the representation: a dtype cast of the model (`model.to(torch.float32)`) moves `weight` and
`weight_scale_inv` to the new device but leaves their dtypes (the bias follows the cast)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from flashstate.ops.fp8 import fp8_linear
from flashstate.ops.fp8.block_quant import BLOCK, FP8_DTYPE, dequantize_block
from flashstate.spec.quantization import Fp8BlockConfig, converts_linear

SCALE_SUFFIX = "weight_scale_inv"


class Fp8Linear(nn.Module):
    """y = x @ (weight · weight_scale_inv per 128×128 block).T + bias, in x's dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        weight = torch.empty(out_features, in_features, dtype=FP8_DTYPE)
        scale = torch.empty(-(-out_features // BLOCK), -(-in_features // BLOCK), dtype=torch.float32)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(scale, requires_grad=False)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: Tensor) -> Tensor:
        return fp8_linear(x, self.weight, self.weight_scale_inv, self.bias)

    def dequantized_weight(self, dtype: torch.dtype) -> Tensor:
        """The weight [out, in] in `dtype` (a new tensor)."""
        return dequantize_block(self.weight, self.weight_scale_inv, dtype)

    def _apply(self, fn, recurse=True):
        quantized = (self.weight, self.weight_scale_inv)

        def keep_dtype(t: Tensor) -> Tensor:
            if not any(t is q for q in quantized):
                return fn(t)
            probe = fn(t.new_empty(0))  # where `fn` puts a tensor of this dtype, and as which dtype
            return fn(t) if probe.dtype == t.dtype else t.to(probe.device)

        return super()._apply(keep_dtype, recurse)

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}, fp8"


def is_fp8(linear: nn.Module) -> bool:
    return isinstance(linear, Fp8Linear)


def dense_weight(linear: nn.Module, dtype: torch.dtype) -> Tensor:
    """A linear layer's weight [out, in] as a plain matrix in `dtype` (dequantized for an `Fp8Linear`; the
    parameter itself otherwise): for the few forwards that read a projection's weight directly."""
    if isinstance(linear, Fp8Linear):
        return linear.dequantized_weight(dtype)
    return linear.weight


def quantize_linears(model: nn.Module, select: Callable[[str, nn.Linear], bool]) -> list[str]:
    """Replace every `nn.Linear` of `model` for which `select(module name, module)` holds by an `Fp8Linear`
    of the same shape (and bias); returns the replaced names. Call it on the meta device, before the model's
    tensors are allocated."""
    chosen = [
        (name, m) for name, m in model.named_modules() if type(m) is nn.Linear and select(name, m)
    ]
    for name, m in chosen:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        with torch.device(m.weight.device):
            setattr(parent, leaf, Fp8Linear(m.in_features, m.out_features, bias=m.bias is not None))
    return [name for name, _ in chosen]


def convert_linears(model: nn.Module, quant: Fp8BlockConfig) -> list[str]:
    """`quantize_linears` with the linears a model built with `quant` and no checkpoint holds in FP8
    (`converts_linear`: `--quantization fp8` on a full-precision checkpoint, or a dummy FP8 model)."""
    return quantize_linears(model, lambda n, m: converts_linear(quant, n, m.out_features, m.in_features))
