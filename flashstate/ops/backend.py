"""Backend choice for the ops: CUDA tensors go to the GPU kernels (FLA / Triton, imported on first use),
everything else to the plain-torch oracles in `naive.py`. `use_reference_ops()` (or FLASHSTATE_REFERENCE_OPS=1
in the environment) sends CUDA tensors to the oracles too: a check free of TF32 and of kernel compiles."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from torch import Tensor

from flashstate import envs

_REFERENCE_ENV = "FLASHSTATE_REFERENCE_OPS"
_reference = envs.FLASHSTATE_REFERENCE_OPS


def use_reference_ops() -> None:
    """The oracles for every op from now on, in this process and in the processes it starts (the
    tensor-parallel workers read the variable when they import this module)."""
    global _reference
    _reference = True
    os.environ[_REFERENCE_ENV] = "1"


def gpu_kernels(probe: Tensor) -> bool:
    """Whether an op on `probe` runs a GPU kernel: on CUDA, unless the oracles were asked for."""
    return probe.is_cuda and not _reference


def backend(package: str, gpu_module: str, probe: Tensor) -> ModuleType:
    """`flashstate.ops.<package>.<gpu_module>` when `probe` takes the GPU kernels, else `.naive`."""
    name = gpu_module if gpu_kernels(probe) else "naive"
    return importlib.import_module(f"flashstate.ops.{package}.{name}")


def dense_on_cpu(t: Tensor) -> Tensor:
    """`t`, made contiguous on the CPU only: there, torch's sigmoid/SiLU take a vectorised path for dense
    inputs and a scalar one (different in the last bit) for strided views, and the oracle stays
    bit-identical to the unfused forms; on CUDA the strided view is read in place."""
    return t if t.is_cuda else t.contiguous()
