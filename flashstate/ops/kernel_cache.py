"""KernelArchive: the Triton kernels a start compiled, kept as one archive per installed stack so the next
start on any machine with the same stack loads them instead of compiling (`--kernel-cache DIR`).

A start on a machine without Triton's cache spends most of its time compiling kernels (benchmarks/RESULTS.md,
cold start). Triton's own cache is per machine (`~/.triton/cache`); this one travels: the
engine restores `DIR/<stack>.tar.gz` into Triton's cache before it builds anything, and after its warm-up
(before serving) writes the archive back when the warm-up compiled kernels the archive lacked. `<stack>`
names what a compiled kernel depends on beyond its source — Triton's and torch's versions, the CUDA
version and the GPU's compute capability — so an archive built elsewhere is used only where it applies;
Triton itself keys each kernel by its source, so a stale entry misses and compiles as before.

Only each kernel's binary and metadata are kept (`*.cubin`, `*.json`: what Triton loads a cached kernel
from; the IR text it keeps beside them is dropped). A missing, foreign or unreadable archive costs a log
line, never a start.
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger("flashstate.ops")

KEPT_SUFFIXES = (".cubin", ".json")


def stack_key(device: torch.device) -> str | None:
    """The archive name's stack part ("triton3.6.0-torch2.11.0-cuda12.9-sm90"); None off CUDA or without
    Triton (nothing is compiled there)."""
    if device.type != "cuda":
        return None
    try:
        import triton
    except ImportError:
        return None
    major, minor = torch.cuda.get_device_capability(device)
    torch_version = torch.__version__.split("+")[0]
    return f"triton{triton.__version__}-torch{torch_version}-cuda{torch.version.cuda}-sm{major}{minor}"


def triton_cache_dir() -> Path | None:
    try:
        from triton import knobs
    except ImportError:
        return None
    return Path(knobs.cache.dir)


class KernelArchive:
    """`directory/<key>.tar.gz` ⇄ the kernel files under `cache_dir` (Triton's cache)."""

    def __init__(self, directory: str | Path, key: str, cache_dir: str | Path):
        self.path = Path(directory) / f"{key}.tar.gz"
        self.cache_dir = Path(cache_dir)
        self._archived: set[str] = set()  # the archive's members, as read by restore()

    def _kept(self) -> list[str]:
        """Relative paths of the kept kernel files now under the cache dir."""
        if not self.cache_dir.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.cache_dir))
            for p in self.cache_dir.rglob("*")
            if p.suffix in KEPT_SUFFIXES and p.is_file()
        )

    def restore(self) -> int:
        """Unpack the archive's kernels that the cache lacks; returns how many were written (0 when there is
        no archive, or it cannot be read: logged)."""
        if not self.path.is_file():
            logger.info("kernel cache: no archive %s; this start compiles its kernels", self.path)
            return 0
        written = 0
        try:
            with tarfile.open(self.path, "r:gz") as tar:
                for member in tar.getmembers():
                    name = Path(member.name)
                    if not member.isfile() or name.is_absolute() or ".." in name.parts:
                        continue  # only plain files inside the cache
                    self._archived.add(member.name)
                    target = self.cache_dir / name
                    if target.exists():
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
                        shutil.copyfileobj(tar.extractfile(member), tmp)
                    os.replace(tmp.name, target)  # a reader never sees half a kernel
                    written += 1
        except (OSError, tarfile.TarError, EOFError) as e:
            logger.warning("kernel cache: cannot read %s (%s); this start compiles its kernels", self.path, e)
            return written
        logger.info("kernel cache: %d kernel files restored from %s", written, self.path)
        return written

    def save(self) -> bool:
        """Write the archive again when the cache holds kernel files it lacks (written whole, then renamed
        over the old one). Returns whether it wrote. Synchronous: the engine calls it before it serves and at
        close, never while serving (packing thousands of files in a thread held the GIL for seconds and
        stalled the server's event loop)."""
        kept = self._kept()
        if not kept or set(kept) <= self._archived:
            return False
        self._write(kept)
        return True

    def _write(self, kept: list[str]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with (
                tempfile.NamedTemporaryFile(dir=self.path.parent, suffix=".part", delete=False) as tmp,
                tarfile.open(fileobj=tmp, mode="w:gz", compresslevel=6) as tar,
            ):
                for name in kept:
                    try:
                        tar.add(self.cache_dir / name, arcname=name, recursive=False)
                    except FileNotFoundError:
                        continue  # removed from the cache since listed
            os.replace(tmp.name, self.path)  # the old archive stays whole until the new one is
            self._archived = set(kept)
            logger.info("kernel cache: %d kernel files written to %s", len(kept), self.path)
        except OSError as e:
            logger.warning("kernel cache: cannot write %s (%s)", self.path, e)


def open_archive(directory: str | Path | None, device: torch.device) -> KernelArchive | None:
    """The engine's archive for `--kernel-cache DIR`; None when unset, off CUDA or without Triton."""
    if directory is None:
        return None
    key, cache_dir = stack_key(device), triton_cache_dir()
    if key is None or cache_dir is None:
        logger.info("kernel cache: nothing to keep on %s without Triton", device)
        return None
    return KernelArchive(directory, key, cache_dir)
