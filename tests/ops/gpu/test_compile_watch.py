"""CompileWatch on the real Triton (CUDA only; CI skips): a kernel launched with a new specialization of an
integer argument is built once more, and the watch counts it; the same one again is not."""

import pytest
import torch

triton = pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import triton.language as tl  # noqa: E402

from flashstate.ops.compile_watch import CompileWatch  # noqa: E402


@triton.jit
def _fill(out, n, value):
    i = tl.arange(0, 64)
    tl.store(out + i, value, mask=i < n)


def test_a_new_specialization_is_counted_once():
    out = torch.zeros(64, device="cuda")
    _fill[(1,)](out, 17, 1.0)  # n not a multiple of 16: built before the watch
    watch = CompileWatch()
    assert watch.install()
    try:
        _fill[(1,)](out, 33, 2.0)  # same specialization: nothing built
        assert watch.counts.total() == 0
        _fill[(1,)](out, 32, 3.0)  # a multiple of 16: another variant
        _fill[(1,)](out, 48, 4.0)
        assert watch.counts == {"_fill": 1}
    finally:
        watch.uninstall()
    assert float(out[47]) == 4.0 and float(out[48]) == 0.0
