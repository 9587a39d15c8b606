import os
import subprocess
import sys
from types import SimpleNamespace

import flashstate.ops.backend as backend_module
from flashstate.ops.backend import backend, gpu_kernels, use_reference_ops

CUDA_PROBE = SimpleNamespace(is_cuda=True)  # only `.is_cuda` is read
CPU_PROBE = SimpleNamespace(is_cuda=False)


def test_cuda_tensors_take_the_gpu_kernels_and_the_rest_the_oracles(monkeypatch):
    monkeypatch.setattr(backend_module, "_reference", False)
    assert gpu_kernels(CUDA_PROBE) and not gpu_kernels(CPU_PROBE)
    assert backend("short_conv", "triton", CPU_PROBE).__name__ == "flashstate.ops.short_conv.naive"


def test_reference_ops_send_cuda_tensors_to_the_oracles_here_and_in_child_processes(monkeypatch):
    monkeypatch.setattr(backend_module, "_reference", False)
    monkeypatch.setenv("FLASHSTATE_REFERENCE_OPS", "0")  # restored (unset) after the test
    use_reference_ops()
    assert not gpu_kernels(CUDA_PROBE)
    assert backend("kda", "fla", CUDA_PROBE).__name__ == "flashstate.ops.kda.naive"
    probe = "from types import SimpleNamespace as S; from flashstate.ops.backend import gpu_kernels as g; "
    child = subprocess.run(
        [sys.executable, "-c", probe + "print(g(S(is_cuda=True)))"],
        env=dict(os.environ),  # what a spawned tensor-parallel worker inherits
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "False"
