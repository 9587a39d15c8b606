"""A tensor-free emulation of vLLM 0.32's shared page pool in "align" mode, for the `vllm` policy.

Read from vllm/v1/core/{block_pool, single_type_kv_cache_manager, kv_cache_coordinator, kv_cache_manager}.py
and sched/scheduler.py (`_mamba_block_aligned_split`); measured against real vLLM in
benchmarks/vllm_reference (README.md there lists the rules). Nothing here holds tensors: a page is an id,
a reference count and at most one cache key.

    | page 0: null | pages 1 .. num_pages-1: one pool shared by every KV-cache group |

Groups 0 .. num_state_groups-1 hold one recurrent-state page per linear layer (a state at position p
is the page of block index p/B - 1); the last group holds attention blocks (block i = tokens
[iB, (i+1)B)). A cache key is (group, chained hash of the prefix up to the block's end).

Free queue (vLLM's `FreeKVCacheBlockQueue`): every page with ref count 0, head first. New pages come
from the head; a hashed page taken there loses its key (the eviction). A `free` appends hashed pages at
the tail (LRU) and prepends unhashed ones (scratch pages are reused first); a hit `touch`es pages out of
the queue. A request frees its groups in group order, each group's pages tail first.

A request's life (exactly vLLM's sequence of pool operations when requests run one at a time):
  begin    lookup (attention run A capped at L - 1; the deepest state held by every state group at a
           multiple of B up to A), then touch the hit.
  advance  the steps our engine has computed past: first the prefill chunks vLLM's scheduler cuts (stops
           at the junction J = A when A > hit, at R = floor((L - 1)/B)·B, and at max_chunk_tokens
           aligned down to B), then one step per decoded token. A step frees the state pages below the
           running state, takes at most one state page per state group (the new running state) and the
           attention pages it needs, then caches the full attention blocks and the state pages at R and
           J only (retention interval 0): so no state survives inside the output.
  end      the remaining steps, then the free.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

Key = tuple[int, int]  # (group, chained block hash)
NULL = 0


def block_hashes(tokens: list[int], block_size: int, salt: str | None = None) -> list[int]:
    """Chained hash of every full block: h[i] covers tokens[: (i + 1) * block_size]; a cache salt seeds the
    chain (as vLLM's first block hash takes it), so different salts share no key."""
    out, parent = [], 0 if salt is None else hash(("salt", salt))
    for i in range(len(tokens) // block_size):
        parent = hash((parent, tuple(tokens[i * block_size : (i + 1) * block_size])))
        out.append(parent)
    return out


@dataclass(slots=True)
class _Request:
    num_prompt_tokens: int
    tokens: list[int]
    hashes: list[int]
    blocks: list[list[int]]  # per group: page ids by block index, NULL for none
    num_cached: list[int]  # per group: block indices already offered to the cache
    junction: int  # vLLM's shared_prefix_boundary
    salt: str | None = None
    computed: int = 0
    last_state: list[int | None] = field(default_factory=list)  # per state group: the previous running state
    retired: list[int] = field(default_factory=list)  # per state group: block indices already freed below
    hit: int = 0
    attention_hit: int = 0


class VllmPagePool:
    def __init__(
        self,
        num_pages: int,
        block_size: int,
        num_state_groups: int,
        max_chunk_tokens: int = 4096,
        on_state_lost: Callable[[list[int], int, str | None], None] | None = None,
    ):
        if num_pages < 2:
            raise ValueError(f"the vllm page pool needs at least 2 pages (one is null), got {num_pages}")
        self.num_pages = num_pages
        self.block_size = block_size
        self.num_state_groups = num_state_groups
        self.attention_group = num_state_groups
        self.max_chunk_tokens = max_chunk_tokens
        self.ref = [0] * num_pages
        self.key: list[Key | None] = [None] * num_pages
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_pages))
        self.cached: dict[Key, dict[int, None]] = {}  # key -> pages holding it, first cached first
        # state key -> (tokens, depth, salt) it stands for
        self.prefix: dict[Key, tuple[list[int], int, str | None]] = {}
        self.requests: dict[str, _Request] = {}
        self.on_state_lost = on_state_lost  # (tokens, depth, salt): the state there is no longer a hit
        self.num_evicted = 0

    # ---- the pool -------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def _take(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise MemoryError(f"asked for {n} pages, {len(self.free_queue)} free")
        pages = []
        for _ in range(n):
            page, _ = self.free_queue.popitem(last=False)
            if self.key[page] is not None:
                self._uncache(page)
            self.ref[page] = 1
            pages.append(page)
        return pages

    def _uncache(self, page: int) -> None:
        key = self.key[page]
        self.key[page] = None
        holders = self.cached[key]
        del holders[page]
        self.num_evicted += 1
        if holders:
            return
        del self.cached[key]
        if key[0] < self.num_state_groups:
            tokens, depth, salt = self.prefix.pop(key)
            if self.on_state_lost is not None and self._state_key_count(key[1]) < self.num_state_groups:
                self.on_state_lost(tokens, depth, salt)

    def _state_key_count(self, h: int) -> int:
        return sum((g, h) in self.cached for g in range(self.num_state_groups))

    def _touch(self, pages: list[int]) -> None:
        for page in pages:
            if page == NULL:
                continue
            if self.ref[page] == 0:
                del self.free_queue[page]
            self.ref[page] += 1

    def _free(self, pages: list[int]) -> None:
        """Pages in eviction order (first is evicted first): hashed ones to the tail, the rest to the head."""
        head, tail = [], []
        for page in pages:
            if page == NULL:
                continue
            self.ref[page] -= 1
            assert self.ref[page] >= 0, f"page {page} freed twice"
            if self.ref[page] == 0:
                (tail if self.key[page] is not None else head).append(page)
        for page in reversed(head):
            self.free_queue[page] = None
            self.free_queue.move_to_end(page, last=False)
        for page in tail:
            self.free_queue[page] = None

    def _cache(self, page: int, key: Key, tokens: list[int], depth: int, salt: str | None) -> None:
        if self.key[page] == key or page in self.cached.get(key, ()):
            return
        assert self.key[page] is None, "a page holds one key"
        self.key[page] = key
        self.cached.setdefault(key, {})[page] = None
        if key[0] < self.num_state_groups:
            self.prefix.setdefault(key, (tokens, depth, salt))

    def _get(self, key: Key) -> int | None:
        holders = self.cached.get(key)
        return next(iter(holders)) if holders else None

    # ---- lookup ---------------------------------------------------------------------------------

    def lookup(self, tokens: list[int], salt: str | None = None) -> tuple[int, int]:
        """(hit, A): the tokens vLLM restores, and how far its cached attention blocks follow `tokens`."""
        B = self.block_size
        hashes = block_hashes(tokens[: (len(tokens) - 1) // B * B], B, salt)
        return self._lookup(hashes)[:2]

    def holds_state(self, tokens: list[int], depth: int, salt: str | None = None) -> bool:
        """Whether every state group holds the state after tokens[:depth] (a hit could end there)."""
        if depth <= 0 or depth % self.block_size:
            return False
        h = block_hashes(tokens[:depth], self.block_size, salt)[-1]
        return self._state_key_count(h) == self.num_state_groups

    def _lookup(self, hashes: list[int]) -> tuple[int, int, list[int], list[int]]:
        B, attn = self.block_size, []
        for h in hashes:
            page = self._get((self.attention_group, h))
            if page is None:
                break
            attn.append(page)
        states: list[int] = []
        for i in range(len(attn) - 1, -1, -1):
            pages = [self._get((g, hashes[i])) for g in range(self.num_state_groups)]
            if all(p is not None for p in pages):
                states = pages
                hit = (i + 1) * B
                break
        else:
            hit = 0
        return hit, len(attn) * B, attn[: hit // B], states

    # ---- a request's life -----------------------------------------------------------------------

    def pages_needed(self, prompt_len: int, hit: int) -> int:
        """Free pages the prefill takes at its peak: its attention blocks, and per state group the running
        state plus the one it continues from. (vLLM checks only the next chunk; alone, a request that
        passes this check never stalls inside its prefill.)"""
        B = self.block_size
        return 2 * self.num_state_groups + -(-prompt_len // B) - hit // B

    def fits(self, num_tokens: int) -> bool:
        """Whether a request of this many tokens can ever be admitted (with its hit touched)."""
        return self.pages_needed(num_tokens, 0) + self.num_state_groups <= self.num_pages - 1

    def begin(self, rid: str, prompt: list[int], salt: str | None = None) -> int | None:
        """Look up a new request and touch its hit; the hit, or None (nothing changed) if its prefill could
        not get its pages now. `advance` then runs its steps."""
        if rid in self.requests:
            raise ValueError(f"request {rid!r} already holds pages")
        B, L = self.block_size, len(prompt)
        hashes = block_hashes(prompt, B, salt)
        hit, a, attn, states = self._lookup(hashes[: (L - 1) // B])
        evictable = sum(self.ref[p] == 0 for p in [*attn, *states])
        if self.pages_needed(L, hit) + evictable > self.num_free:
            return None
        n = self.num_state_groups
        req = _Request(
            L, list(prompt), hashes, [[] for _ in range(n + 1)], [0] * (n + 1), a if a > hit else 0, salt
        )
        req.hit, req.attention_hit = hit, a
        req.last_state, req.retired = [None] * n, [0] * n
        self.requests[rid] = req
        for g in range(n):
            req.blocks[g] = [NULL] * (hit // B - 1) + [states[g]] if hit else []
            self._touch(req.blocks[g])
        req.blocks[n] = list(attn)
        self._touch(attn)
        req.num_cached = [len(b) for b in req.blocks]
        req.computed = hit
        return hit

    def advance(self, rid: str, tokens: list[int], computed: int) -> None:
        """Run the request's steps (vLLM's prefill chunks, then one token per decode step) that end at or
        before `computed`; `tokens` (prompt + generated so far) only grows. A step the pool cannot give
        pages waits for a later call (only with requests running side by side, where vLLM would have
        preempted one)."""
        req = self.requests[rid]
        req.tokens = tokens
        while True:
            end = self._chunk_end(req) if req.computed < req.num_prompt_tokens else req.computed + 1
            if end > computed:
                return
            if len(req.hashes) < len(tokens) // self.block_size:
                req.hashes = block_hashes(tokens, self.block_size, req.salt)
            if not self._step(req, end - req.computed):
                return

    def can_grow(self, rid: str, target: int) -> bool:
        """Whether the pool can give the request the pages for `target` computed tokens now (vLLM's check
        before a step; pages freed by retiring old states are not counted). The request may lag behind
        our engine (its steps are vLLM's chunks), and what a short pool kept it from taking counts here
        too. False: vLLM would preempt a running request, and so must we."""
        return self.pages_to_grow(rid, target) <= self.num_free

    def pages_to_grow(self, rid: str, target: int) -> int:
        """The pages the request takes to reach `target` computed tokens from the blocks it holds now."""
        req = self.requests[rid]
        blocks = -(-target // self.block_size)
        states = sum(blocks > len(req.blocks[g]) for g in range(self.num_state_groups))
        return states + max(blocks - len(req.blocks[self.attention_group]), 0)

    def end(self, rid: str, tokens: list[int]) -> None:
        """Run the remaining steps of `tokens` (prompt + every generated token; the last one is never
        computed) and free the request."""
        self.advance(rid, tokens, len(tokens) - 1)
        self.release(rid)

    def release(self, rid: str) -> None:
        """Free everything a request holds (request end, abort or preemption)."""
        req = self.requests.pop(rid, None)
        if req is None:
            return
        for pages in req.blocks:
            self._free(list(reversed(pages)))

    def _chunk_end(self, req: _Request) -> int:
        """vLLM's `_mamba_block_aligned_split` for a request that runs alone."""
        B, L, start = self.block_size, req.num_prompt_tokens, req.computed
        end = min(start + self.max_chunk_tokens, L)
        if end < L:
            aligned = end // B * B
            if aligned > start or self.max_chunk_tokens >= B:
                end = aligned
        last = (L - 1) // B * B
        floored = start + (req.junction - start) // B * B
        stops = (
            (start // B + 1) * B if start % B else 0,
            last,
            floored if start < req.junction < end else 0,
        )
        return min((s for s in stops if start < s < end), default=end)

    def _step(self, req: _Request, n: int) -> bool:
        """One scheduler step computing tokens [computed, computed + n) (vLLM's `allocate_slots`); False
        (nothing allocated) when the pool lacks the pages."""
        B, total = self.block_size, req.computed
        for g in range(self.num_state_groups):
            self._retire_states(req, g, total)
        num_tokens = total + n
        need = -(-num_tokens // B)
        states = sum(need > len(req.blocks[g]) for g in range(self.num_state_groups))
        if states + max(need - len(req.blocks[self.attention_group]), 0) > self.num_free:
            return False
        for g in range(self.num_state_groups):
            self._allocate_state(req, g, num_tokens)
        attn = req.blocks[self.attention_group]
        attn.extend(self._take(max(-(-num_tokens // B) - len(attn), 0)))
        self._cache_blocks(req, min(num_tokens, len(req.tokens)))
        req.computed = num_tokens
        return True

    def _retire_states(self, req: _Request, g: int, processed: int) -> None:
        """Free the state pages below the running state (`MambaManager.remove_skipped_blocks`)."""
        B, blocks = self.block_size, req.blocks[g]
        if processed > 1 and blocks:
            first, last = req.retired[g], min((processed - 1) // B, len(blocks))
            if first < last:
                freed = []
                for i in range(last - 1, first - 1, -1):
                    if blocks[i] != NULL:
                        freed.append(blocks[i])
                        blocks[i] = NULL
                self._free(freed)
                req.retired[g] = last
        i = req.last_state[g]
        if i is not None and i < -(-processed // B) - 1 and blocks[i] != NULL:
            self._free([blocks[i]])
            blocks[i] = NULL

    def _allocate_state(self, req: _Request, g: int, num_tokens: int) -> None:
        """At most one new state page per step, at the block index of the running state."""
        blocks = req.blocks[g]
        need = -(-num_tokens // self.block_size)
        if need <= len(blocks):
            return
        if blocks:
            req.last_state[g] = len(blocks) - 1
        blocks.extend([NULL] * (need - 1 - len(blocks)))
        blocks.extend(self._take(1))

    def _cache_blocks(self, req: _Request, num_tokens: int) -> None:
        B = self.block_size
        full = num_tokens // B
        keep = {b // B * B // B - 1 for b in (req.num_prompt_tokens - 1, req.junction) if b}
        for g, blocks in enumerate(req.blocks):
            state = g < self.num_state_groups
            for i in range(req.num_cached[g], full):
                if blocks[i] == NULL or (state and i not in keep):
                    continue
                self._cache(blocks[i], (g, req.hashes[i]), req.tokens, (i + 1) * B, req.salt)
            req.num_cached[g] = max(req.num_cached[g], full)

    # ---- views (tests, traces) ------------------------------------------------------------------

    def path_map(self, tokens: list[int]) -> dict[str, str]:
        """Like benchmarks/vllm_reference's `cached_before`: per group, '1' where block i's key is cached."""
        hashes = block_hashes(tokens, self.block_size)
        out = {}
        for g in range(self.num_state_groups + 1):
            name = f"mamba{g}" if g < self.num_state_groups else f"attn{g}"
            out[name] = "".join("1" if (g, h) in self.cached else "." for h in hashes)
        return out

    def cached_keys_per_group(self) -> list[int]:
        counts = [0] * (self.num_state_groups + 1)
        for g, _ in self.cached:
            counts[g] += 1
        return counts

    def check_integrity(self) -> None:
        held: dict[int, int] = {}
        for req in self.requests.values():
            for pages in req.blocks:
                for p in pages:
                    if p != NULL:
                        held[p] = held.get(p, 0) + 1
        for p in range(1, self.num_pages):
            if self.ref[p] != held.get(p, 0):
                raise AssertionError(f"page {p}: ref {self.ref[p]}, held by {held.get(p, 0)} request slots")
            if (self.ref[p] == 0) != (p in self.free_queue):
                raise AssertionError(
                    f"page {p}: ref {self.ref[p]} but free-queue membership {p in self.free_queue}"
                )
        for key, holders in self.cached.items():
            for p in holders:
                if self.key[p] != key:
                    raise AssertionError(f"page {p} is cached under {key} but holds {self.key[p]}")
