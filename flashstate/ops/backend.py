"""Backend choice for the ops: CUDA tensors go to the GPU kernels (FLA / Triton, imported on first use),
everything else to the plain-torch oracles in `naive.py`."""

from __future__ import annotations

import importlib
from types import ModuleType

from torch import Tensor


def backend(package: str, gpu_module: str, probe: Tensor) -> ModuleType:
    """`flashstate.ops.<package>.<gpu_module>` when `probe` lives on a CUDA device, else `.naive`."""
    name = gpu_module if probe.is_cuda else "naive"
    return importlib.import_module(f"flashstate.ops.{package}.{name}")


def dense_on_cpu(t: Tensor) -> Tensor:
    """`t`, made contiguous on the CPU only: there, torch's sigmoid/SiLU take a vectorised path for dense
    inputs and a scalar one (different in the last bit) for strided views, and the oracle stays
    bit-identical to the unfused forms; on CUDA the strided view is read in place."""
    return t if t.is_cuda else t.contiguous()
