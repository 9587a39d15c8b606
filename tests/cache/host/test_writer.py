"""HostWriter alone, on a store that records its calls: jobs in queue order, a put the store refuses ends
that write-back, an unreachable store goes to `on_unavailable`, a bad job does not stop the thread, and an
unavailable tier is asked to reconnect while the queue is idle."""

import threading
import time

import torch

from flashstate.cache.host.codec import ObjectBuilder
from flashstate.cache.host.store import StoreUnavailableError
from flashstate.cache.host.writer import HostWriter


class RecordingStore:
    def __init__(self, refuse: set[str] = frozenset(), down: bool = False):
        self.calls: list[tuple[str, str]] = []
        self.refuse, self.down = refuse, down

    def put(self, key: str, data: torch.Tensor) -> bool:
        if self.down:
            raise StoreUnavailableError("store down")
        self.calls.append(("put", key))
        return key not in self.refuse

    def remove(self, key: str) -> None:
        self.calls.append(("remove", key))


def _objects(*keys: str) -> list[ObjectBuilder]:
    return [ObjectBuilder(k, [(torch.float32, (4,))]) for k in keys]


def _writer(store, available=lambda: True, **kw):
    reports, outages, reconnects = [], [], []
    writer = HostWriter(
        store,
        available,
        kw.get("on_written", lambda state, objs, written: reports.append((state, [o.key for o in written]))),
        outages.append,
        lambda: reconnects.append(time.monotonic()),
        retry_seconds=kw.get("retry", 0.05),
    )
    return writer, reports, outages, reconnects


def _drain(writer: HostWriter) -> None:
    deadline = time.monotonic() + 10
    while writer.pending and time.monotonic() < deadline:
        time.sleep(0.005)
    assert writer.pending == 0


def test_jobs_reach_the_store_in_queue_order_and_a_refused_put_ends_its_write_back():
    store = RecordingStore(refuse={"c2"})
    writer, reports, outages, _ = _writer(store)
    writer.write("s1", _objects("c1", "s1"), None)
    writer.remove("old")
    writer.write("s2", _objects("c2", "c3", "s2"), None)
    _drain(writer)
    assert store.calls == [("put", "c1"), ("put", "s1"), ("remove", "old"), ("put", "c2")]
    assert reports == [("s1", ["c1", "s1"]), ("s2", [])] and outages == []
    writer.close()


def test_an_unreachable_store_is_reported_and_a_bad_job_does_not_stop_the_thread():
    store = RecordingStore(down=True)
    calls = []

    def on_written(state, objs, written):
        calls.append(state)
        if state == "bad":
            raise RuntimeError("bookkeeping failed")

    writer, _, outages, _ = _writer(store, on_written=on_written)
    writer.write("s1", _objects("s1"), None)
    _drain(writer)
    assert len(outages) == 1 and isinstance(outages[0], StoreUnavailableError) and calls == ["s1"]
    store.down = False
    writer.write("bad", _objects("b"), None)
    writer.write("s2", _objects("s2"), None)
    _drain(writer)
    assert calls == ["s1", "bad", "s2"] and ("put", "s2") in store.calls
    writer.close()


def test_an_unavailable_tier_is_asked_to_reconnect_while_idle_and_skips_its_jobs():
    up = threading.Event()
    store = RecordingStore()
    writer, reports, _, reconnects = _writer(store, available=up.is_set, retry=0.02)
    writer.write("s1", _objects("s1"), None)
    writer.remove("k")
    _drain(writer)
    time.sleep(0.1)
    assert store.calls == [] and reports == [] and len(reconnects) >= 2
    up.set()
    writer.write("s2", _objects("s2"), None)
    _drain(writer)
    assert store.calls == [("put", "s2")]
    writer.close()
