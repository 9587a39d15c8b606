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
