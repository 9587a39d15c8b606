"""fla_tensor_cache_off: FLA's identity memo is off inside, as it was after (an error included), FLA imported
if it was not yet (graphs are captured before anything else imports it)."""

import sys

import pytest

from flashstate.ops.fla_cache import fla_tensor_cache_off


@pytest.fixture
def fake_fla(tmp_path, monkeypatch):
    """An importable `fla.utils` with the flag, not imported yet."""
    (tmp_path / "fla" / "utils").mkdir(parents=True)
    (tmp_path / "fla" / "__init__.py").write_text("")
    (tmp_path / "fla" / "utils" / "__init__.py").write_text("FLA_DISABLE_TENSOR_CACHE = False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("fla", "fla.utils"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("fla", "fla.utils"):
        sys.modules.pop(name, None)


def test_the_memo_is_off_inside_and_restored_after(fake_fla):
    assert "fla.utils" not in sys.modules
    with fla_tensor_cache_off():
        assert sys.modules["fla.utils"].FLA_DISABLE_TENSOR_CACHE is True
    fla_utils = sys.modules["fla.utils"]
    assert fla_utils.FLA_DISABLE_TENSOR_CACHE is False
    with pytest.raises(RuntimeError, match="capture failed"), fla_tensor_cache_off():
        raise RuntimeError("capture failed")
    assert fla_utils.FLA_DISABLE_TENSOR_CACHE is False


def test_without_fla_it_does_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # import fla raises ImportError
    with fla_tensor_cache_off():
        pass
