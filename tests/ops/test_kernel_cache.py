"""The kernel archive (`--kernel-cache DIR`): what a start compiled travels to the next start with the same
stack, and a missing, foreign or broken archive never stops a start."""

import logging
import os
import subprocess
import sys
import tarfile

import pytest
import torch

from flashstate import LLM
from flashstate.ops.kernel_cache import KernelArchive, open_archive

KEY = "tritonX-torchY-cudaZ-sm90"


def _fill(cache, names):
    for name in names:
        path = cache / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode() * 3)


def test_the_archive_keeps_binaries_and_metadata_and_restores_them(tmp_path):
    first = tmp_path / "triton-a"
    _fill(first, ["h1/k.cubin", "h1/k.json", "h1/__grp__k.json", "h1/k.ttir", "h1/k.ptx", "h2/m.cubin"])
    archive = KernelArchive(tmp_path / "kernels", KEY, first)
    assert archive.save()
    with tarfile.open(archive.path) as tar:
        assert sorted(tar.getnames()) == ["h1/__grp__k.json", "h1/k.cubin", "h1/k.json", "h2/m.cubin"]

    second = tmp_path / "triton-b"  # a bare machine: an empty Triton cache
    again = KernelArchive(tmp_path / "kernels", KEY, second)
    assert again.restore() == 4
    assert (second / "h1/k.cubin").read_bytes() == b"h1/k.cubin" * 3
    assert not (second / "h1/k.ttir").exists()
    assert again.restore() == 0  # present already
    assert not again.save()  # nothing new: the archive stays as it is
    _fill(second, ["h3/new.cubin"])
    assert again.save()
    with tarfile.open(again.path) as tar:
        assert "h3/new.cubin" in tar.getnames()


def test_another_stack_or_a_broken_archive_costs_a_log_line(tmp_path, caplog):
    cache = tmp_path / "triton"
    _fill(cache, ["h/k.cubin"])
    KernelArchive(tmp_path / "kernels", KEY, cache).save()
    assert KernelArchive(tmp_path / "kernels", "triton9-torch9-cuda9-sm100", tmp_path / "t2").restore() == 0

    (tmp_path / "kernels" / f"{KEY}.tar.gz").write_bytes(b"not a tarball")
    with caplog.at_level(logging.WARNING, logger="flashstate.ops"):
        assert KernelArchive(tmp_path / "kernels", KEY, tmp_path / "t3").restore() == 0
    assert "cannot read" in caplog.text

    evil = tmp_path / "evil" / f"{KEY}.tar.gz"
    evil.parent.mkdir()
    payload = tmp_path / "payload.cubin"
    payload.write_bytes(b"x")
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(payload, arcname="../outside.cubin")
        tar.add(payload, arcname="ok/inside.cubin")
    target = tmp_path / "t4"
    assert KernelArchive(evil.parent, KEY, target).restore() == 1
    assert (target / "ok/inside.cubin").exists() and not (tmp_path / "outside.cubin").exists()


def test_on_the_cpu_the_flag_is_accepted_and_keeps_nothing(tiny_model_dir, tmp_path):
    assert open_archive(tmp_path, torch.device("cpu")) is None
    llm = LLM(
        tiny_model_dir, device="cpu", kernel_cache=str(tmp_path / "kernels"), kv_cache_memory_bytes=64 << 20
    )
    assert llm.generate([[5, 6, 7]])[0].token_ids
    llm.engine.close()
    assert not (tmp_path / "kernels").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels need a GPU")
def test_a_second_start_on_an_empty_triton_cache_restores_the_first_starts_kernels(tiny_model_dir, tmp_path):
    pytest.importorskip("triton")
    code = (
        "import sys; from flashstate import LLM; "
        "llm = LLM(sys.argv[1], device='cuda', kernel_cache=sys.argv[2], kv_cache_memory_bytes=256 << 20, "
        "max_num_seqs=4); llm.generate([[5, 6, 7]]); llm.engine.close()"
    )

    def start(triton_dir):
        env = dict(os.environ, TRITON_CACHE_DIR=str(triton_dir))
        subprocess.run([sys.executable, "-c", code, tiny_model_dir, str(tmp_path / "k")], env=env, check=True)

    start(tmp_path / "triton-a")
    archives = list((tmp_path / "k").glob("*.tar.gz"))
    assert len(archives) == 1 and "-sm" in archives[0].name
    start(tmp_path / "triton-b")
    assert any((tmp_path / "triton-b").rglob("*.cubin"))  # restored, or compiled again and kept
    with tarfile.open(archives[0]) as tar:
        restored = {n for n in tar.getnames() if n.endswith(".cubin")}
    assert restored and all((tmp_path / "triton-b" / n).exists() for n in restored)
