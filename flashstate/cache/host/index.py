"""HostIndex: what the host store holds, hybrid states and the KV chunks they reference, with
Greedy-Dual-Size eviction of whole states.

A state at depth p references the chunk objects 1..floor(p / C) (shared between states, ref counted) and
has its own state object; `used` = bytes of every object indexed, ≤ capacity after `make_room`. A state
is restorable once its own object and every chunk it references are written (`ready`).
Eviction: H = L + C(p) / bytes, bytes = the state object plus the chunks only it references; L rises to
the H of each evicted state; a hit re-stamps; a new state that would have to evict states of higher H is
not written. Every object that leaves the index goes to `on_remove` (the tier removes it from the store).
A pinned state (a restore reading it) is never evicted: an in-process store reuses an evicted object's bytes
at once. Not locked: the tier holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from flashstate.cache.host.layout import HostLayout


@dataclass(slots=True)
class Chunk:
    nbytes: int
    holders: set[str] = field(default_factory=set)  # the keys of the states that reference it
    ready: bool = False

    @property
    def refs(self) -> int:
        return len(self.holders)


@dataclass(slots=True)
class IndexedState:
    key: str
    depth: int
    base: bytes  # chain hash of the last full chunk
    chunks: list[str]
    nbytes: int
    priority: float = 0.0  # GDS L when stamped
    ready: bool = False
    exclusive: int = 0  # bytes of the chunks only this state references (kept as holders change)
    pins: int = 0  # restores reading it now


@dataclass(slots=True)
class HostHit:
    """A restorable state on a prompt's path: its key, depth and chunk keys; `remote`: found by probing a
    shared store (another engine wrote it), not in this tier's index."""

    key: str
    depth: int
    chunks: list[str]
    remote: bool = False


class HostIndex:
    def __init__(self, capacity: int, saved: Callable[[int], float], on_remove: Callable[[str], None]):
        self.capacity = capacity
        self.used = 0
        self.clock = 0.0  # GDS L
        self._saved = saved  # prefill seconds a state at this depth saves
        self._on_remove = on_remove
        self.evictions = 0
        self.states: dict[str, IndexedState] = {}
        self.chunks: dict[str, Chunk] = {}
        self._by_base: dict[bytes, list[IndexedState]] = {}

    def __len__(self) -> int:
        return len(self.states)

    def holds(self, key: str) -> bool:
        return key in self.states or key in self.chunks

    def touch(self, key: str) -> bool:
        """Re-stamp the state `key` (a hit, or a write-back of a state already held); False if absent."""
        state = self.states.get(key)
        if state is not None:
            state.priority = self.clock
        return state is not None

    def pin(self, key: str, by: int) -> None:
        """A restore starts reading the state `key` (by = 1) or is done with it (by = -1)."""
        state = self.states.get(key)
        if state is not None:
            state.pins += by

    def admit(
        self, key: str, depth: int, base: bytes, chunk_keys: list[str], state_bytes: int, chunk_bytes: int
    ) -> bool:
        """Make room for the state `key` and the chunks among `chunk_keys` not yet held, then index them
        (not ready); False, with nothing indexed, when they cannot fit."""
        new = [k for k in chunk_keys if k not in self.chunks]
        need = state_bytes + len(new) * chunk_bytes
        if need > self.capacity:
            return False
        # The newcomer's references to the chunks it shares are taken before room is made: evicting a
        # state that holds them must not drop them (the caller writes only `new`).
        shared = [k for k in chunk_keys if k in self.chunks]
        for k in shared:
            self._hold(k, key)
        if not self.make_room(need, self.clock + self._saved(depth) / need):
            for k in shared:
                self._release(k, key)
            return False
        for k in new:
            self.chunks[k] = Chunk(chunk_bytes, {key})
        state = IndexedState(key, depth, base, chunk_keys, state_bytes, self.clock)
        state.exclusive = sum(self.chunks[k].nbytes for k in chunk_keys if self.chunks[k].refs == 1)
        self.states[key] = state
        self._by_base.setdefault(base, []).append(state)
        self.used += need
        return True

    def value(self, state: IndexedState) -> float:
        return self._saved(state.depth) / (state.nbytes + state.exclusive)

    def make_room(self, need: int, priority: float) -> bool:
        """Evict states of lower priority than `priority` (the incoming state's H) until `need` bytes fit."""
        while self.used + need > self.capacity:
            best, best_h = None, None
            for s in self.states.values():
                if s.ready and not s.pins:
                    h = s.priority + self.value(s)
                    if best_h is None or h < best_h:
                        best, best_h = s, h
            if best is None or best_h > priority:
                return False
            self.clock = max(self.clock, best_h)
            self.forget(best)
            self.evictions += 1
        return True

    def forget(self, state: IndexedState) -> None:
        """Drop a state and the chunks no other state references."""
        if self.states.pop(state.key, None) is None:
            return
        self._by_base[state.base].remove(state)
        if not self._by_base[state.base]:
            del self._by_base[state.base]
        self.used -= state.nbytes
        self._on_remove(state.key)
        for k in state.chunks:
            self._release(k, state.key)

    def _hold(self, chunk_key: str, state_key: str) -> None:
        """`state_key` references the chunk: a chunk that was one state's alone is that state's no more."""
        chunk = self.chunks[chunk_key]
        if chunk.refs == 1:
            self._add_exclusive(next(iter(chunk.holders)), -chunk.nbytes)
        chunk.holders.add(state_key)

    def _release(self, chunk_key: str, state_key: str) -> None:
        """`state_key` no longer references the chunk: the last holder has it alone, none removes it."""
        chunk = self.chunks[chunk_key]
        chunk.holders.discard(state_key)
        if chunk.refs == 1:
            self._add_exclusive(next(iter(chunk.holders)), chunk.nbytes)
        elif chunk.refs == 0:
            del self.chunks[chunk_key]
            self.used -= chunk.nbytes
            self._on_remove(chunk_key)

    def _add_exclusive(self, state_key: str, nbytes: int) -> None:
        state = self.states.get(state_key)
        if state is not None:  # else the newcomer being admitted: it counts its own when indexed
            state.exclusive += nbytes

    def forget_object(self, key: str) -> None:
        """A chunk or state object is gone or bad: every state that needs it leaves the index."""
        if key in self.chunks:
            self.chunks[key].ready = False
        for s in [s for s in self.states.values() if s.key == key or key in s.chunks]:
            self.forget(s)

    def mark_written(self, key: str, chunk_keys: list[str]) -> bool:
        """The state `key` and the chunks it wrote are in the store: restorable. False if it has left."""
        state = self.states.get(key)
        if state is None:
            return False
        for k in chunk_keys:
            self.chunks[k].ready = True
        state.ready = True
        return True

    def find(
        self, tokens: list[int], limit: int, hashes: list[bytes], layout: HostLayout
    ) -> HostHit | None:
        """The deepest restorable state at a depth ≤ `limit` on the path of `tokens` (`hashes`: its chain)."""
        for j in range(len(hashes) - 1, -1, -1):
            best = None
            for s in self._by_base.get(hashes[j], ()):
                if (
                    s.ready
                    and s.depth <= limit
                    and (best is None or s.depth > best.depth)
                    and all(self.chunks[k].ready for k in s.chunks)
                    and layout.state_key(hashes[j], tokens, s.depth) == s.key
                ):
                    best = s
            if best is not None:
                return HostHit(best.key, best.depth, list(best.chunks))
        return None

    def clear(self) -> None:
        """Forget everything without removing anything (the store's contents are unknown)."""
        self.states.clear()
        self.chunks.clear()
        self._by_base.clear()
        self.used = 0
