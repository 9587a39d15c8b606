"""Every environment variable flashstate reads, in one place (as vLLM's `envs.py`).

Each is read when its attribute is read, so a test's `monkeypatch.setenv` and a parent process's
`os.environ` change take effect at once: `from flashstate import envs; envs.FLASHSTATE_HOME`.
`flashstate serve --help` and docs/design.md list the same names.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _str(name: str) -> Callable[[], str | None]:
    return lambda: os.environ.get(name) or None


def _flag(name: str, default: bool) -> Callable[[], bool]:
    return lambda: os.environ.get(name, "1" if default else "0") == "1"


def _seconds(name: str) -> Callable[[], float]:
    return lambda: float(os.environ.get(name, "0") or 0)


def _home() -> Path:
    home = os.environ.get("FLASHSTATE_HOME")
    return Path(home) if home else Path.home() / ".cache" / "flashstate"


# name → (reader, what it does)
VARIABLES: dict[str, tuple[Callable[[], Any], str]] = {
    "FLASHSTATE_HOME": (_home, "root of materialised presets and calibrations (default ~/.cache/flashstate)"),
    "FLASHSTATE_API_KEY": (_str("FLASHSTATE_API_KEY"), "the server's API key when --api-key is not given"),
    "VLLM_API_KEY": (_str("VLLM_API_KEY"), "read after FLASHSTATE_API_KEY, as vLLM does"),
    "OPENAI_API_KEY": (_str("OPENAI_API_KEY"), "`bench` sends it to the server when --api-key is not given"),
    "FLASHSTATE_HOST_CACHE_SECRET": (
        _str("FLASHSTATE_HOST_CACHE_SECRET"),
        "host-tier MAC secret when --host-cache-secret-file is not given",
    ),
    "FLASHSTATE_REFERENCE_OPS": (
        _flag("FLASHSTATE_REFERENCE_OPS", False),
        "1: the plain-torch oracles for every op, CUDA tensors included",
    ),
    "FLASHSTATE_SDPA_GQA": (
        _flag("FLASHSTATE_SDPA_GQA", True),
        "0: repeat K/V heads before SDPA instead of letting it group them",
    ),
    "FLASHSTATE_STACK_SAMPLE": (
        _str("FLASHSTATE_STACK_SAMPLE"),
        "PATH: sample the engine thread's stack, report to PATH at stop (%p: the pid)",
    ),
    "FLASHSTATE_STACK_DUMP_S": (
        _seconds("FLASHSTATE_STACK_DUMP_S"),
        "seconds: every tensor-parallel worker dumps all its threads' stacks at this interval",
    ),
    "FLASHSTATE_GC_CENSUS": (
        _flag("FLASHSTATE_GC_CENSUS", False),
        "1: count what each young garbage collection walks (a diagnosis, not for production)",
    ),
    "FLASHSTATE_SERVER_DEV_MODE": (
        _flag("FLASHSTATE_SERVER_DEV_MODE", False),
        "1: serve the development endpoints (POST /reset_prefix_cache), as --enable-dev-endpoints",
    ),
    "VLLM_SERVER_DEV_MODE": (
        _flag("VLLM_SERVER_DEV_MODE", False),
        "vLLM's name of FLASHSTATE_SERVER_DEV_MODE",
    ),
    "TRITON_INTERPRET": (_flag("TRITON_INTERPRET", False), "Triton's own: 1 runs kernels in its interpreter"),
}


def __getattr__(name: str) -> Any:
    if name in VARIABLES:
        return VARIABLES[name][0]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(VARIABLES)
