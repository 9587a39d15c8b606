"""Faults of the host tier: cache salts that must not share, objects someone else wrote under this engine's
keys (a wrong layout, random values with a valid checksum, with and without a deployment secret), and a
real mooncake_master that hangs (SIGSTOP), is down at start-up, restarts empty, or fills up; the
Mooncake client's listeners on loopback; a master that dies with its parent."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch

from flashstate.cache.host.codec import check, encode
from flashstate.cache.host.mooncake import MooncakeStore, free_port, start_master
from flashstate.cache.host.store import MemoryStore
from tests.cache.host.conftest import BLOCK, CHUNK, make_caches, make_tier
from tests.procnet import is_loopback, listening

SECRET = b"deployment secret for the tests"


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(n)]


def _blocks(depth: int, first: int = 0) -> list[int]:
    return list(range(first, first + -(-depth // BLOCK)))


def _wait(predicate, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# ---- cache salts ----------------------------------------------------------------------------------------


def test_two_salts_never_share_a_state_and_no_salt_keeps_the_unsalted_keys(new_store):
    store = new_store()
    tier = make_tier(store, make_caches(seed=2), fingerprint="salted-model")
    tokens = _tokens(22, 0)  # two whole chunks and a tail
    tier.write_back(tokens, 22, _blocks(22), 0, salt="alice")
    tier.flush()
    assert tier.lookup(tokens + [1], 22, salt="alice").depth == 22
    assert tier.lookup(tokens + [1], 22, salt="bob") is None
    assert tier.lookup(tokens + [1], 22) is None
    assert tier.lookup(tokens[:8] + [1], 9, salt="bob") is None  # not even the first chunk is shared
    tier.write_back(tokens, 22, _blocks(22), 1)
    tier.flush()
    unsalted = tier.lookup(tokens + [1], 22)
    assert unsalted is not None and unsalted.key != tier.lookup(tokens + [1], 22, salt="alice").key
    assert tier.stats.states_written == 2 and tier.stats.objects_written == 6  # no chunk was shared
    # salt None keeps the keys every earlier engine wrote: the chain from H(fingerprint) alone
    assert tier.layout.keys(tokens, 22)[1] == unsalted.key == tier.layout.keys(tokens, 22, salt=None)[1]
    known: list[bytes] = []  # a chain cached for one salt is started over for another
    tier.layout.chain(tokens, 22, known, salt="alice")
    assert tier.layout.chain(tokens, 22, known) == tier.layout.chain(tokens, 22)
    if store.shared:  # another engine of the same model, probing the shared store, obeys the salt too
        other = make_tier(store, make_caches(seed=2), fingerprint="salted-model")
        assert other.lookup(tokens + [1], 22, salt="alice").depth == 22
        assert other.lookup(tokens + [1], 22, salt="carol") is None
        other.close()
    tier.close()


# ---- objects planted under this engine's keys -------------------------------------------------------------


def _plant(store, key: str, tensors: list[torch.Tensor], secret: bytes | None = None) -> None:
    """What any client of the store can do: replace the object under `key` (a valid checksum)."""
    store.remove(key)
    assert store.put(key, encode(key, tensors, secret))


def _written(store, secret: bytes | None = None, seed: int = 0):
    caches = make_caches(seed=seed)
    tier = make_tier(store, caches, secret=secret)
    tokens = _tokens(22, seed)
    tier.write_back(tokens, 22, _blocks(22), 0)
    tier.flush()
    hit = tier.lookup(tokens + [1], 22)
    assert hit is not None
    return tier, tokens, hit


def test_an_object_of_another_layout_is_a_counted_miss_never_an_exception(new_store):
    store = new_store()
    tier, tokens, hit = _written(store)
    specs = check(hit.key, store.get(hit.key))[0]
    wrong = [torch.zeros(s[0] + 1, *s[1:], dtype=d) if s else torch.zeros(1, dtype=d) for d, s in specs]
    _plant(store, hit.key, wrong)
    assert tier.fetch(hit) is None  # load() would have raised on the engine thread
    assert tier.stats.misses_layout == 1 and tier.lookup(tokens + [1], 22) is None
    _, _, hit = _written(store, seed=1)
    fewer = [torch.zeros(s, dtype=d) for d, s in check(hit.chunks[0], store.get(hit.chunks[0]))[0]][:-1]
    _plant(store, hit.chunks[0], fewer)  # a chunk naming one tensor less
    halves = [torch.zeros(s, dtype=torch.float16) for _, s in check(hit.key, store.get(hit.key))[0]]
    _plant(store, hit.key, halves)  # the state object in another dtype
    restore = tier.start_restore(hit, 0, 22, _blocks(22, first=30), 6)
    restore.future.result(30)
    assert restore.poll().value == "failed"
    tier.close()


@pytest.mark.parametrize("secret", [None, SECRET])
def test_random_values_with_a_valid_checksum_are_rejected_only_under_a_secret(new_store, secret):
    store = new_store()
    tier, tokens, hit = _written(store, secret)
    g = torch.Generator().manual_seed(7)
    specs = check(hit.key, store.get(hit.key))[0]
    forged = [torch.randn(s, generator=g).to(d) for d, s in specs]  # the right shapes: it would restore
    _plant(store, hit.key, forged)
    if secret is None:  # the limitation README's "Host tier" states: trust the store's network
        assert tier.fetch(hit) is not None and tier.stats.misses_forged == 0
    else:
        assert tier.fetch(hit) is None
        assert tier.stats.misses_forged == 1 and tier.lookup(tokens + [1], 22) is None
        assert not store.exists(hit.key)  # removed: the next write-back puts a genuine one
    tier.close()


def test_the_mac_binds_the_key_and_every_byte_and_needs_the_secret():
    tensors = [torch.arange(12, dtype=torch.float32).view(3, 4), torch.ones(2, 2, dtype=torch.bfloat16)]
    buf = encode("a/1", tensors, SECRET)
    assert check("a/1", buf, secret=SECRET)[1] == "ok"
    assert check("a/1", buf)[1] == "ok"  # an engine without the secret still reads it (checksum only)
    assert check("a/1", buf, secret=b"another secret")[1] == "forged"
    assert check("a/1", encode("a/1", tensors), secret=SECRET)[1] == "forged"  # no MAC at all
    assert check("a/2", encode("a/2", tensors, b"another secret"), secret=SECRET)[1] == "forged"
    flipped = buf.clone()
    flipped[-1] ^= 1
    assert check("a/1", flipped, secret=SECRET)[1] == "corrupt"  # the checksum tells an accident apart
    other_key = encode("a/2", tensors, SECRET)
    assert check("a/1", other_key, secret=SECRET)[1] in ("forged", "corrupt")
    expected = [(t.dtype, tuple(t.shape)) for t in tensors]
    assert check("a/1", buf, expected, SECRET)[1] == "ok"
    assert check("a/1", buf, expected[:1], SECRET)[1] == "layout"
    assert check("a/1", buf, [(torch.float32, (4, 3)), expected[1]], SECRET)[1] == "layout"


class _Refusing(MemoryStore):
    """Refuses a put beyond its capacity (as a full Mooncake pool does); builds no objects itself."""

    allocate = None


def test_a_full_store_refuses_and_is_counted_not_an_outage():
    # the index believes there is room: the store decides
    tier = make_tier(_Refusing(256 << 10), make_caches(num_blocks=512), capacity=1 << 30)
    for seed in range(40):
        tier.write_back(_tokens(400, seed), 400, _blocks(400), 0)
        tier.flush()
    assert tier.stats.store_refusals >= 1 and tier.available and tier.stats.outages == 0
    tier.close()


def test_a_full_mooncake_pool_refuses_puts_without_an_outage(mooncake_master):
    """An object with no room in the pool (here: larger than all of it, so the master's own eviction
    cannot make room whatever the machine's speed) is refused and counted; the store stays up."""
    store = MooncakeStore(mooncake_master.address, 16 << 20)
    try:
        assert store.put("test/full/small", torch.zeros(1 << 20, dtype=torch.uint8))
        assert not store.put("test/full/big", torch.zeros(24 << 20, dtype=torch.uint8))
        assert store.refusals == 1
        assert store.ping()  # up, only full
    finally:
        store.close()


def test_puts_land_in_the_writers_segment_and_outlive_another_client(mooncake_master):
    """Objects a client writes while its own segment has room are placed there: a second client that
    leaves (an engine of the fleet that stops or dies) takes none of them (unplaced, about half would go)."""
    writer = MooncakeStore(mooncake_master.address, 16 << 20)
    other = MooncakeStore(mooncake_master.address, 16 << 20)
    keys = [f"test/placement/{uuid.uuid4().hex}" for _ in range(8)]
    try:
        for i, key in enumerate(keys):
            assert writer.put(key, torch.full((1 << 20,), i, dtype=torch.uint8))
        other.close()
        got = [writer.get(key) for key in keys]
        assert all(g is not None and int(g[0]) == i for i, g in enumerate(got))
    finally:
        writer.close()


# ---- a real mooncake_master that hangs, is down, restarts ----------------------------------------------


class _Counting(MooncakeStore):
    """Counts the calls that reach the store (lookups that cost the engine thread nothing do not)."""

    calls = 0

    def exists_many(self, keys):
        self.calls += 1
        return super().exists_many(keys)

    def get(self, key):
        self.calls += 1
        return super().get(key)


@pytest.fixture
def own_master(tmp_path):
    """A master of this test alone (it is stopped, killed or restarted), on a free loopback port."""
    masters = [start_master(log=str(tmp_path / "master.log"))]
    yield masters
    for m in masters:
        m.stop()


def test_a_hung_master_costs_one_deadline_then_nothing_until_it_answers_again(own_master):
    master = own_master[0]
    store = _Counting(master.address, 32 << 20, timeout=2.0)
    tier = make_tier(store, make_caches(), retry=0.05)
    tokens = _tokens(22, 0)
    tier.write_back(tokens, 22, _blocks(22), 0)
    tier.flush()
    assert tier.lookup(tokens + [1], 22).depth == 22
    os.kill(master.process.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        # a probe of the store: past its deadline, or the client's own failure code at about the same time
        # (under load either first). On a loaded machine the master may still answer a call sent as the
        # signal lands: the next probe then finds it hung.
        for seed in range(1, 4):
            assert tier.lookup(_tokens(30, seed), 30) is None
            if not tier.available:
                break
        assert time.monotonic() - start < 20  # the client's own RPC timeout (30 s) was not waited for
        assert not tier.available and tier.stats.outages == 1
        calls = store.calls
        for seed in range(5):  # during the outage the engine thread does not touch the store at all
            assert tier.lookup(_tokens(30, seed), 30) is None
            tier.write_back(_tokens(22, seed), 22, _blocks(22), 0)
        assert store.calls == calls and tier.stats.writes_skipped >= 5
        time.sleep(2.5)  # the background probe times out too, and the tier stays down
        assert not tier.available
    finally:
        os.kill(master.process.pid, signal.SIGCONT)
    assert _wait(lambda: tier.available), "the tier did not come back after SIGCONT"
    assert tier.stats.reconnects == 1
    tier.write_back(tokens, 22, _blocks(22), 0)
    tier.flush()
    assert tier.lookup(tokens + [1], 22).depth == 22
    tier.close()


def test_a_master_down_at_start_is_joined_in_the_background(tmp_path):
    port = free_port()
    store = MooncakeStore(f"127.0.0.1:{port}", 32 << 20, connect=False, timeout=2.0)
    tier = make_tier(store, make_caches(), retry=0.05)
    try:
        store.connect()
        raise AssertionError("joined a master that is not running")
    except Exception as e:  # noqa: BLE001 — what build_host_tier does on start-up
        tier.mark_unavailable(e)
    assert not tier.available and tier.lookup(_tokens(22, 0), 22) is None
    master = start_master(port=port, log=str(tmp_path / "master.log"))
    try:
        assert _wait(lambda: tier.available), "the tier never joined the master that came up"
        tokens = _tokens(22, 0)
        tier.write_back(tokens, 22, _blocks(22), 0)
        tier.flush()
        assert tier.lookup(tokens + [1], 22).depth == 22
        tier.close()
    finally:
        master.stop()


def test_a_master_restarted_empty_is_a_miss_then_serves_again(own_master, tmp_path):
    master = own_master[0]
    port = int(master.address.rpartition(":")[2])
    store = MooncakeStore(master.address, 32 << 20, timeout=2.0)
    tier = make_tier(store, make_caches(), retry=0.05)
    tokens = _tokens(22, 0)
    tier.write_back(tokens, 22, _blocks(22), 0)
    tier.flush()
    hit = tier.lookup(tokens + [1], 22)
    master.process.kill()
    master.process.wait()
    own_master.append(start_master(port=port, log=str(tmp_path / "master2.log")))
    fetched = tier.fetch(hit)  # the index still lists it (or the outage emptied the index): a miss
    assert fetched is None and (tier.stats.misses_dropped == 1 or tier.stats.outages == 1)
    assert _wait(lambda: tier.available)

    def written_again() -> bool:
        tier.write_back(tokens, 22, _blocks(22), 0)
        tier.flush()
        return tier.lookup(tokens + [1], 22) is not None

    assert _wait(written_again), "the tier never wrote to the restarted master"
    tier.close()


def test_the_clients_listeners_bind_loopback_only(mooncake_master):
    store = MooncakeStore(mooncake_master.address, 16 << 20)
    try:
        mine = listening(os.getpid())
        assert len(mine) >= 2  # the transfer engine's handshake daemon and its TCP transport
        assert all(is_loopback(a) for a, _ in mine), mine
        peer = MooncakeStore(mooncake_master.address, 16 << 20)  # objects cross between two clients' segments
        for i in range(8):
            key = f"test/listen/{i}"
            assert peer.put(key, torch.full((1 << 20,), i, dtype=torch.uint8))
            got = store.get(key)
            assert got is not None and int(got[0]) == i and got.numel() == 1 << 20
        peer.close()
    finally:
        store.close()


@pytest.mark.parametrize("stopped", [False, True])
def test_a_master_dies_with_the_process_that_started_it(tmp_path, stopped):
    script = textwrap.dedent(
        """
        import sys, time
        from flashstate.cache.host.mooncake import start_master
        m = start_master()
        print(m.process.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        if stopped:  # a hung master: SIGTERM would stay pending
            os.kill(pid, signal.SIGSTOP)
        parent.kill()
        parent.wait()
        assert _wait(lambda: not _alive(pid), 30), "the master outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_memory_store_faults_are_counted_the_same_way():
    store = MemoryStore(1 << 20)
    tier, _, hit = _written(store, SECRET)
    _plant(store, hit.key, [torch.zeros(3)])
    assert tier.fetch(hit) is None and tier.stats.misses_forged == 1
    tier.close()
    assert CHUNK % BLOCK == 0


def test_the_cli_master_dies_with_the_cli_whatever_ends_it():
    cli = subprocess.Popen(
        [sys.executable, "-m", "flashstate.cli", "mooncake-master", "--port", str(free_port()),
         "--metrics-port", str(free_port())],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert cli.stdout.readline().startswith("mooncake_master on 127.0.0.1:")
        (master,) = _children(cli.pid)
        cli.kill()  # no handler runs: only PR_SET_PDEATHSIG can end the master
        cli.wait()
        assert _wait(lambda: not _alive(master), 30), "mooncake_master outlived `flashstate mooncake-master`"
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def test_the_secret_comes_from_the_file_else_the_environment(tmp_path, monkeypatch):
    from flashstate.cache.host.build import host_secret
    from flashstate.config import EngineConfig

    monkeypatch.delenv("FLASHSTATE_HOST_CACHE_SECRET", raising=False)
    assert host_secret(EngineConfig()) is None
    monkeypatch.setenv("FLASHSTATE_HOST_CACHE_SECRET", "from the environment")
    assert host_secret(EngineConfig()) == b"from the environment"
    path = tmp_path / "secret"
    path.write_bytes(b"from the file\n")
    assert host_secret(EngineConfig(host_cache_secret_file=str(path))) == b"from the file"
    path.write_bytes(b"\n")
    with pytest.raises(ValueError, match="empty"):
        host_secret(EngineConfig(host_cache_secret_file=str(path)))
    with pytest.raises(ValueError, match="host_cache_timeout"):
        EngineConfig(host_cache_bytes=1 << 20, host_cache_timeout=0)
