import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The embedded default model, materialised once per test session (HF format on disk)."""
    from flashstate.models.presets import materialize

    path = tmp_path_factory.mktemp("tiny")
    materialize("tiny", path, seed=0)
    return str(path)
