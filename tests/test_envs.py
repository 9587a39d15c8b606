"""Every FLASHSTATE_* variable is read through flashstate/envs.py, and each is listed there."""

from __future__ import annotations

import re
from pathlib import Path

import flashstate
from flashstate import envs

PACKAGE = Path(flashstate.__file__).parent


def test_only_envs_reads_the_environment():
    readers = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "envs.py":
            continue
        source = path.read_text(encoding="utf-8")
        if re.search(r"os\.environ\.get\(|os\.getenv\(", source):
            readers.append(str(path.relative_to(PACKAGE)))
    assert readers == []


def test_every_named_variable_is_listed():
    named = set()
    for path in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r"\bFLASHSTATE_[A-Z0-9_]+\b", path.read_text(encoding="utf-8")))
    assert named <= set(envs.VARIABLES)


def test_read_when_read(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHSTATE_HOME", str(tmp_path))
    assert tmp_path == envs.FLASHSTATE_HOME
    monkeypatch.setenv("FLASHSTATE_SDPA_GQA", "0")
    assert envs.FLASHSTATE_SDPA_GQA is False
    monkeypatch.delenv("FLASHSTATE_STACK_DUMP_S", raising=False)
    assert envs.FLASHSTATE_STACK_DUMP_S == 0.0
