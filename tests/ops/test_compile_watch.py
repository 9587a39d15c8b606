"""CompileWatch: kernel variants Triton builds while serving are counted and logged through Triton's JIT
hooks, which stay chained to hooks set before and are restored on uninstall (a fake `triton.knobs` here; the
real one on the GPU: tests/ops/gpu/test_compile_watch.py)."""

import logging
import sys
import types

import pytest

from flashstate.ops.compile_watch import CompileWatch


@pytest.fixture
def runtime(monkeypatch):
    """A `triton` whose knobs.runtime holds the two JIT hooks, one already set by someone else."""
    seen = []
    runtime = types.SimpleNamespace(
        jit_cache_hook=None, jit_post_compile_hook=lambda **kw: seen.append(kw["repr"])
    )
    triton = types.ModuleType("triton")
    triton.knobs = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "triton", triton)
    runtime.seen = seen
    return runtime


def _build(runtime, repr_: str) -> None:
    """What Triton's JIT does around building a variant it has not got in memory."""
    kw = dict(key="k", repr=repr_, fn=None, compile={}, is_manual_warmup=False, already_compiled=False)
    if runtime.jit_cache_hook is not None:
        assert not runtime.jit_cache_hook(**kw)  # a true answer would skip the compile
    runtime.jit_post_compile_hook(**kw)


def test_each_variant_is_counted_and_logged_and_the_old_hooks_still_run(runtime, caplog):
    old_post = runtime.jit_post_compile_hook
    watch = CompileWatch()
    assert watch.install() and watch.installed
    with caplog.at_level(logging.INFO, logger="flashstate.ops"):
        _build(runtime, "_conv_kernel[num_warps=4](x: *bf16, T: i32)")
        _build(runtime, "_conv_kernel[num_warps=8](x: *bf16, T: i32)")
        _build(runtime, "_paged_attention_kernel(q: *bf16)")
    assert watch.counts == {"_conv_kernel": 2, "_paged_attention_kernel": 1}
    assert runtime.seen == [
        "_conv_kernel[num_warps=4](x: *bf16, T: i32)",
        "_conv_kernel[num_warps=8](x: *bf16, T: i32)",
        "_paged_attention_kernel(q: *bf16)",
    ]
    assert sum("first built while serving" in r.message for r in caplog.records) == 3
    assert watch.describe().startswith("3 kernel variants built while serving")
    assert "_conv_kernel ×2" in watch.describe()
    watch.uninstall()
    assert not watch.installed
    assert runtime.jit_cache_hook is None and runtime.jit_post_compile_hook is old_post
    _build(runtime, "_later(x)")
    assert watch.counts.total() == 3


def test_nothing_built_says_so():
    assert CompileWatch().describe() == "no kernel variant built while serving"


def test_without_triton_or_its_hooks_it_does_not_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    assert not CompileWatch().install()
    old = types.ModuleType("triton")
    old.knobs = types.SimpleNamespace(runtime=types.SimpleNamespace())  # a Triton without JIT hooks
    monkeypatch.setitem(sys.modules, "triton", old)
    watch = CompileWatch()
    assert not watch.install() and not watch.installed
    watch.uninstall()  # harmless
