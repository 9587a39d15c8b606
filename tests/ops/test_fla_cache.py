"""fla_tensor_cache_off: FLA's identity memo is off inside, as it was after (an error included)."""

import sys
import types

import pytest

from flashstate.ops.fla_cache import fla_tensor_cache_off


def test_the_memo_is_off_inside_and_restored_after(monkeypatch):
    fla_utils = types.SimpleNamespace(FLA_DISABLE_TENSOR_CACHE=False)
    monkeypatch.setitem(sys.modules, "fla.utils", fla_utils)
    with fla_tensor_cache_off():
        assert fla_utils.FLA_DISABLE_TENSOR_CACHE is True
    assert fla_utils.FLA_DISABLE_TENSOR_CACHE is False
    with pytest.raises(RuntimeError, match="capture failed"), fla_tensor_cache_off():
        raise RuntimeError("capture failed")
    assert fla_utils.FLA_DISABLE_TENSOR_CACHE is False


def test_without_fla_loaded_it_does_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "fla.utils", raising=False)
    with fla_tensor_cache_off():
        assert "fla.utils" not in sys.modules
