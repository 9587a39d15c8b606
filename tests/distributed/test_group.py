import logging
import threading
import time

import torch.distributed as dist

from flashstate.distributed.group import TPGroup


def _nccl_group() -> TPGroup:
    group = TPGroup.__new__(TPGroup)  # as on GPU: NCCL through the default group (no own gloo group)
    group.pg, group.rank = None, 0
    return group


def test_close_destroys_the_default_group_once(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append(1))
    _nccl_group().close(timeout=5)
    assert calls == [1]


def test_close_leaves_a_stuck_teardown_behind(monkeypatch, caplog):
    release = threading.Event()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: release.wait(30))
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="flashstate"):
        _nccl_group().close(timeout=0.2)
    release.set()
    assert time.monotonic() - start < 25  # not the 30 s the stuck teardown would have taken
    assert "NCCL teardown unfinished after 0 s" in caplog.text


def test_close_without_a_group_does_nothing(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: (_ for _ in ()).throw(AssertionError))
    _nccl_group().close(timeout=5)
