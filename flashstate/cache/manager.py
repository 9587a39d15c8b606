"""CacheManager: the one facade the scheduler sees over the block pool, the state pool and the prefix tree.

Verbs:
    admit(seq)            a working state slot, and the prefix hit: the deepest checkpoint on the
                          prompt's cached path, restored into the working slot; KV blocks shared,
                          except a partially filled last block, which is copied (copy-on-write)
    allocate(seq, n)      KV blocks for the next n tokens, evicting cache units when short
    exports(seq, n)       checkpoint slots for planned positions inside the next n tokens; a spare one
                          (the policy's `auto` block-boundary fallbacks) only while it fits without
                          evicting anything, now or for the live sequences' prompts (`spare_room`)
    commit_export(...)    after the step: the exported state becomes a checkpoint in the tree
    release(seq, commit)  at request end the frontier checkpoint is committed (policy permitting),
                          then every block reference and the working slot are returned
    preempt(seq)          release a preempted sequence, its state at its position kept as a checkpoint

Host tier hooks (cache/host/, optional): `admit` starts a restore from the host when the host holds a
deeper state than the GPU tree (the sequence then waits in `seq.restore`, holding its slot and blocks,
until `poll_restore` says the state has landed or the restore failed); `release` of a finished request
writes its state back (off the critical path), and of a restoring one cancels the restore.

Ownership: a block's ref count = tree nodes holding it + sequences whose block table holds it. A slot
is owned by one running sequence, one tree node, or one in-flight export.

With `pages` (the `vllm` policy), an emulation of vLLM's page pool (cache/vllm_pages.py) decides: it
gives each request its hit depth and junction, refuses admission while it lacks free pages, and every
state it loses is evicted from the tree; the tree keeps a checkpoint only while the pool holds that
state, and no KV-only paths (the pool tracks vLLM's attention blocks).

With `byte_budget` (the `flashstate` policy's shared budget), KV blocks in use and checkpoint slots (held
or being exported) are charged against one number of bytes: whenever blocks or an export slot are wanted,
or a new checkpoint is admitted, units are evicted by the policy's priority, whichever kind they are,
until the charge fits. With `working_charged` a running sequence's working slot is charged too, from its
admission (which evicts for it like the rest, after locking its own hit) to its release, so the memory
of the working slots no request holds serves KV and checkpoints; otherwise they are reserved apart.

Where a session resumes (the flashstate policy with its retry fallback): a client that re-sends each reply
token for token resumes at the request's end (its frontier checkpoint); one that re-renders its history
(a chat template dropping the reasoning, tool calls re-serialised) leaves the reply's path at the prompt's
end, so its next request resumes at the retry checkpoint one token before it, and the frontier is dead.
Each request's resume points (its retry checkpoint, its end, or both) get the leaf-last protection, chosen
at admission from where the request itself resumed:
    on a retry checkpoint whose request's end is still cached (the session left that reply, which loses
        its protection): the retry point; its end too unless that request had left its reply as well
        (one departure is as likely an edit or a branch; in agent traces 97% of the answers after a
        reasoning answer reason too, so two in a row is a re-rendering session)
    on a request's end (its retry point loses its protection): the end
    anywhere else (a first turn, or both evicted): by the share of recent continuations that left their
        reply; both while it is neither near 0 (token-id clients) nor near 1 (every client re-renders)
A hit takes the protection off the checkpoint it lands on: it has served, and the request's own resume
points take over. A protected retry point is written to the host tier at request end, as the end is.

Victims come from an `EvictionIndex` (cache/eviction_index.py) over the tree: every stamp, checkpoint
set or cleared and lock taken or dropped here is reported to it. Before it, spare checkpoints (from spare
exports, not hit by any request since) go, oldest first and unpriced (the GDS clock stays): they hold only
memory nothing else wanted when they were taken, and give it back first; a hit makes one a priced unit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.eviction_index import EvictionIndex
from flashstate.cache.host.restore import RestorePhase
from flashstate.cache.host.tier import HostTier
from flashstate.cache.policy import Policy
from flashstate.cache.state_pool import StatePool
from flashstate.cache.stats import CacheStats
from flashstate.cache.tree import Match, Node, RadixTree
from flashstate.cache.vllm_pages import VllmPagePool
from flashstate.sequence import Sequence


@dataclass(slots=True)
class _Resume:
    """What admission learnt of a sequence's session: which of its resume points to protect (module
    docstring), whether this sequence left its previous reply, and its retry checkpoint once exported."""

    retry: bool
    end: bool
    left_reply: bool = False
    prompt_end: Node | None = None


class CacheManager:
    def __init__(
        self,
        block_pool: BlockPool,
        state_pool: StatePool,
        policy: Policy | None = None,
        max_checkpoints: int = 0,
        copy_block: Callable[[int, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        host: HostTier | None = None,
        pages: VllmPagePool | None = None,
        byte_budget: int | None = None,
        working_charged: bool = False,
    ):
        self.block_pool = block_pool
        self.state_pool = state_pool
        self.policy = policy
        self.max_checkpoints = max_checkpoints
        self.tree = RadixTree(block_pool)
        self.index = EvictionIndex(self.tree, policy) if policy is not None else None
        self.stats = CacheStats()
        self._copy_block = copy_block
        self.clock = clock
        self._inflight: set[int] = set()  # export slots between schedule and commit
        # admitted sequences (by id) until released, and the spare positions of each one's export plan
        self._live: dict[int, Sequence] = {}
        self._spare: dict[int, frozenset[int]] = {}
        # checkpoints from spare exports not hit since (by id, oldest first): the first victims of any kind
        self._spare_nodes: dict[int, Node] = {}
        self.spare_exports = [0, 0]  # spare exports skipped, taken
        # Resume points (module docstring): the share of recent continuations that resumed at a prompt's end,
        # and what admission learnt of each admitted sequence (by id, until release)
        self.rerender_share, self._resumes_seen = 0.0, self.RERENDER_PRIOR
        self._resumes: dict[int, _Resume] = {}
        self.num_checkpoints = 0
        self.host = host
        self.pages = pages
        self.byte_budget = byte_budget
        self.working_charged = working_charged and byte_budget is not None and policy is not None
        if pages is not None:
            pages.on_state_lost = self._drop_lost_state

    @property
    def block_size(self) -> int:
        return self.block_pool.block_size

    @property
    def enabled(self) -> bool:
        return self.policy is not None

    def can_ever_fit(self, num_tokens: int) -> bool:
        if self.pages is not None and not self.pages.fits(num_tokens):
            return False
        return self.block_pool.blocks_for(num_tokens) <= self.max_seq_blocks

    @property
    def max_seq_blocks(self) -> int:
        """The most KV blocks one sequence can hold: the pool's, or with `working_charged` what the budget
        has beside its working slot."""
        if not self.working_charged:
            return self.block_pool.num_blocks
        room = (self.byte_budget - self.policy.bytes_per_slot) // self.policy.bytes_per_block
        return min(self.block_pool.num_blocks, room)

    # ---- admission ------------------------------------------------------------------------------

    def admit(self, seq: Sequence, miss: bool = False) -> bool:
        """Give a waiting sequence its working slot and its prefix hit; False (nothing held) if no slot.
        `miss`: take no hit (nothing on a cached path is locked, so everything cached can be evicted). A host
        restore takes the sequence's read-ahead over."""
        if not self.working_charged:
            slot = self._take_slot()
            if slot is None:
                return False
            seq.state_slot = slot
            if not self.enabled:
                return True
        match = self.tree.match([], 0) if miss and self.pages is None else self._match(seq)
        if match is None:  # the emulated vLLM pool lacks free pages: wait, like vLLM's scheduler
            self.state_pool.free(seq.state_slot)
            seq.state_slot = None
            return False
        self._lock(match.node, +1)  # from here on nothing on the hit path can be evicted
        if self.working_charged:  # its slot's bytes, evicting other units for them
            slot = self._take_slot(charged=True)
            if slot is None:
                self._lock(match.node, -1)
                return False
            seq.state_slot = slot
            if not miss:  # those may include KV-only nodes below the locked hit: its KV depth again
                again = self._match(seq)
                self._lock(again.node, +1)
                self._lock(match.node, -1)
                match = again
        self._live[id(seq)] = seq  # until release()
        if self.policy.fallback_retry and id(seq) not in self._resumes:
            self._resumes[id(seq)] = self._learn_resume(seq, match)
        self._unprotect(match.node)  # it has served: this request's resume points take over
        if self.host is not None and not miss and self._restore_from_host(seq, match):
            return True
        self._spare_nodes.pop(id(match.node), None)  # a hit: a spare checkpoint has proved its worth
        if match.depth:
            table = self.tree.block_table(match.node)
            full = match.depth // self.block_size
            seq.block_table = table[:full]
            self.block_pool.incref(seq.block_table)
            copy = self._take_blocks(1) if match.depth % self.block_size else []
            if copy is None:  # no block to copy the partial one into: treat as a miss
                self.block_pool.free(seq.block_table)
                seq.block_table = []
                self._lock(match.node, -1)
                match = self.tree.match([], 0)
            else:
                for block in copy:
                    self._copy_block(table[full], block)
                seq.block_table.extend(copy)
                self.state_pool.copy(match.node.slot, slot)
                self._stamp(match.node, self.clock())
        seq.num_computed_tokens = match.depth
        seq.cache_handle = match.node
        self._plan(seq, match)
        return True

    # `rerender_share`: the mean over the continuations seen, starting from RERENDER_PRIOR that resumed at
    # their frontiers, then a moving average over the last RERENDER_WINDOW or so. Below HEDGE_SHARE (above
    # 1 - HEDGE_SHARE) a session not known yet protects only its end (only its retry point).
    RERENDER_PRIOR, RERENDER_WINDOW, HEDGE_SHARE = 2, 32, 0.1

    def _learn_resume(self, seq: Sequence, match: Match) -> _Resume:
        """Where `seq` resumed, and so which of its own resume points to protect (module docstring)."""
        node, reply = match.node, match.node.reply
        if len(seq.token_ids) > node.end + 1:  # past the hit (a retry of the same prompt teaches nothing)
            if reply is not None and reply.slot is not None:
                # A continuation stopped here: the reply's checkpoint, deeper on the same request's path, is
                # not on this prompt's path. Nothing of this session comes back to it.
                self._unprotect(reply)
                self._observe(prompt_end=True)
                return _Resume(retry=True, end=not node.resumed_at_prompt_end, left_reply=True)
            if node.ends_request and node.slot is not None:
                if node.retry_point is not None:
                    self._unprotect(node.retry_point)
                self._observe(prompt_end=False)
                return _Resume(retry=False, end=True)
        share = self.rerender_share
        return _Resume(retry=share >= self.HEDGE_SHARE, end=share <= 1 - self.HEDGE_SHARE)

    def _unprotect(self, node: Node) -> None:
        if node.frontier:
            node.frontier = False
            self.index.touched(node)

    def _observe(self, prompt_end: bool) -> None:
        self._resumes_seen += 1
        weight = 1 / min(self._resumes_seen, self.RERENDER_WINDOW)
        self.rerender_share += (prompt_end - self.rerender_share) * weight

    def _plan(self, seq: Sequence, match: Match) -> None:
        seq.export_plan, spare = self.policy.plan_exports(seq, match)
        if spare:
            self._spare[id(seq)] = spare
        else:
            self._spare.pop(id(seq), None)

    @property
    def reads_ahead(self) -> bool:
        """Queued requests' host hits are read ahead (cache/host/prefetch.py)."""
        return self.host is not None and self.host.reads_ahead and self.enabled and self.pages is None

    def queued(self, seq: Sequence) -> int:
        """`seq` joined the queue: the depth `admit` would resume from now, the GPU tree's or the host tier's
        where deeper (the vLLM page pool not asked); a host hit deeper than the GPU's is read ahead where
        the tier does. Takes nothing from the GPU cache and stamps nothing."""
        if not self.enabled or self.pages is not None:
            return 0
        limit = len(seq.token_ids) - 1
        match = self.tree.match(seq.token_ids, limit=limit, salt=seq.cache_salt)
        if self.host is None:
            return match.depth
        hit = self.host.lookup(
            seq.token_ids, limit, match.depth, seq.host_chain, salt=seq.cache_salt, peek=True
        )
        if hit is None:
            return match.depth
        if self.host.reads_ahead and seq.prefetch is None:
            first = min(match.kv_depth, hit.depth) // self.host.layout.chunk_tokens
            seq.prefetch = self.host.prefetch(hit, first)
        return hit.depth

    def drop_prefetch(self, seq: Sequence) -> None:
        """`seq` left the queue: a read-ahead no restore took over is dropped (its state unpinned)."""
        if seq.prefetch is not None:
            seq.prefetch.drop()
            seq.prefetch = None

    def _match(self, seq: Sequence) -> Match | None:
        if self.pages is None:
            return self.tree.match(seq.token_ids, limit=len(seq.token_ids) - 1, salt=seq.cache_salt)
        hit = self.pages.begin(seq.request_id, seq.token_ids, seq.cache_salt)
        if hit is None:
            return None
        match = self.tree.match(seq.token_ids, limit=hit, salt=seq.cache_salt)
        if match.depth != hit:  # the tree lost a state the pool holds (its own pools ran short)
            self.stats.evictions["vllm_pool_divergence"] += 1
        return Match(match.node, match.depth, self.pages.requests[seq.request_id].attention_hit)

    def _drop_lost_state(self, tokens: list[int], depth: int, salt: str | None) -> None:
        match = self.tree.match(tokens[:depth], salt=salt)
        if match.depth == depth:
            self._evict(match.node, "vllm_pool")

    def record_admission(self, seq: Sequence) -> None:
        """Count a request's prefix-cache lookup once, when it is first admitted for good (an admission
        undone for lack of blocks, or a re-admission after preemption, does not count)."""
        if seq.stats.cache_counted:
            return
        seq.stats.cache_counted = True
        depth = seq.num_computed_tokens
        s = self.stats
        s.queries += 1
        s.query_tokens += seq.num_prompt_tokens
        s.hits += depth > 0
        s.cached_tokens += depth
        s.uncached_tokens += seq.num_prompt_tokens - depth
        seq.stats.num_cached_tokens = depth

    # ---- per step -------------------------------------------------------------------------------

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make the block table cover num_computed_tokens + num_new_tokens; False (nothing taken) if short."""
        if self.pages is not None:
            self.pages.advance(seq.request_id, seq.token_ids, seq.num_computed_tokens)
            if not self.pages.can_grow(seq.request_id, seq.num_computed_tokens + num_new_tokens):
                return False  # the emulated pool is short: the scheduler preempts, as vLLM's does
        need = self.block_pool.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need <= 0:
            return True
        blocks = self._take_blocks(need)
        if blocks is None:
            return False
        seq.block_table.extend(blocks)
        return True

    def make_room(self, num_blocks: int) -> bool:
        """Evict cache units until `num_blocks` blocks are free (and, with a shared budget, chargeable);
        False if they cannot be."""
        while self.block_pool.num_free < num_blocks or not self._chargeable(num_blocks, 0):
            kind = "kv" if self.byte_budget is None else "unit"
            victim = self._victim(kind) if self.enabled else None
            if victim is None:
                return False
            self._evict(victim, "capacity_kv")
        return True

    @property
    def charged_bytes(self) -> int:
        """Bytes held against the shared budget: KV blocks in use, checkpoints and in-flight exports, and with
        `working_charged` the working slots held (every slot in use)."""
        blocks = self.block_pool.num_blocks - self.block_pool.num_free
        if self.working_charged:
            slots = self.state_pool.num_slots - self.state_pool.num_free
        else:
            slots = self.num_checkpoints + len(self._inflight)
        return blocks * self.policy.bytes_per_block + slots * self.policy.bytes_per_slot

    @property
    def slot_blocks(self) -> int:
        """KV blocks' worth of the shared budget a running sequence's working slot is charged (0: reserved
        apart), which memory admission counts in its footprint."""
        if not self.working_charged:
            return 0
        return -(-self.policy.bytes_per_slot // self.policy.bytes_per_block)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be had without evicting anything."""
        free = self.block_pool.num_free
        if self.byte_budget is None or not self.enabled:
            return free
        return min(free, (self.byte_budget - self.charged_bytes) // self.policy.bytes_per_block)

    @property
    def kv_capacity_blocks(self) -> int:
        """The most KV blocks running sequences could hold with every cache unit evicted (with
        `working_charged`, their working slots' `slot_blocks` each among them)."""
        if self.byte_budget is None or not self.enabled:
            return self.block_pool.num_blocks
        return min(self.block_pool.num_blocks, self.byte_budget // self.policy.bytes_per_block)

    def _chargeable(self, blocks: int, slots: int) -> bool:
        if self.byte_budget is None or not self.enabled:
            return True
        extra = blocks * self.policy.bytes_per_block + slots * self.policy.bytes_per_slot
        return self.charged_bytes + extra <= self.byte_budget

    def exports(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """(tokens into this chunk, destination slot) for planned checkpoints the chunk passes; a spare one
        only when `spare_room()` (else it is skipped: it never evicts, directly or later)."""
        start, out = seq.num_computed_tokens, []
        spare = self._spare.get(id(seq), frozenset())
        for p in seq.export_plan:
            if start < p <= start + num_new_tokens:
                if p in spare:
                    if not self.spare_room():
                        self.spare_exports[False] += 1
                        continue
                    self.spare_exports[True] += 1
                slot = self._take_slot(charged=True)
                if slot is None:
                    break
                self._inflight.add(slot)
                out.append((p - start, slot))
        return out

    def spare_room(self) -> bool:
        """One more checkpoint fits without evicting anything: a checkpoint slot is free and, with the
        shared budget, its bytes are free beside the KV blocks every live sequence still needs to reach
        its first token (so the blocks it takes now are not evicted for a little later)."""
        if self.num_checkpoints + len(self._inflight) >= self.max_checkpoints or not self.state_pool.num_free:
            return False
        if self.byte_budget is None:
            return True  # blocks and slots are pools apart: a slot takes no block's room
        blocks_for = self.block_pool.blocks_for
        need = sum(
            max(blocks_for(s.num_prompt_tokens + 1) - len(s.block_table), 0) for s in self._live.values()
        )
        return need <= self.num_free_blocks and self._chargeable(need, 1)

    def commit_export(self, seq: Sequence, depth: int, slot: int) -> None:
        """The slot now holds the state after token depth - 1 of `seq` (whose KV is computed)."""
        self._inflight.discard(slot)
        if self.pages is not None:
            self.pages.advance(seq.request_id, seq.token_ids, depth)
        spare = depth in self._spare.get(id(seq), ())
        # the retry checkpoint (learnt only under the retry fallback): a re-rendering session's next request
        # resumes there, so it is one of the session's frontiers
        learnt = self._resumes.get(id(seq)) if depth == seq.num_prompt_tokens - 1 else None
        node = self._insert_checkpoint(
            seq, depth, slot, frontier=learnt is not None and learnt.retry, spare=spare
        )
        if learnt is not None and node is not None:
            learnt.prompt_end = node
            node.resumed_at_prompt_end = learnt.left_reply

    def abandon_exports(self) -> None:
        """Free the slots of exports whose step failed (between steps every in-flight export is one)."""
        for slot in self._inflight:
            self.state_pool.free(slot)
        self._inflight.clear()

    def release(self, seq: Sequence, commit: bool) -> None:
        """Return everything a finished (commit=True), aborted or preempted sequence holds."""
        if seq.restore is not None:  # aborted (or failed) while restoring from the host tier
            seq.restore.cancel()
            seq.restore = None
        learnt = self._resumes.pop(id(seq), None) or _Resume(retry=False, end=True)
        prompt_end = learnt.prompt_end
        if prompt_end is not None and prompt_end.slot is None:
            prompt_end = None  # evicted since
        if commit and self.host is not None and seq.num_computed_tokens and seq.state_slot is not None:
            # the states the session's next request may resume at: its protected resume points
            points = [(prompt_end.end, prompt_end.slot)] if learnt.retry and prompt_end is not None else []
            if learnt.end or not points:
                points.append((seq.num_computed_tokens, seq.state_slot))
            for depth, slot in points:
                self.host.write_back(
                    seq.token_ids, depth, seq.block_table, slot, seq.host_chain, salt=seq.cache_salt
                )
        frontier = self.enabled and self.policy.frontier
        if commit and frontier and seq.num_computed_tokens and seq.state_slot is not None:
            slot, seq.state_slot = seq.state_slot, None
            end = self._insert_checkpoint(seq, seq.num_computed_tokens, slot, frontier=learnt.end)
            if end is not None:
                end.ends_request = True
                if prompt_end is not None:
                    prompt_end.reply, end.retry_point = end, prompt_end
        if self.pages is not None:
            if commit:
                self.pages.end(seq.request_id, seq.token_ids[: seq.num_computed_tokens + 1])
            else:
                self.pages.release(seq.request_id)
        elif commit and self.enabled and self.policy.decode_kv:
            # vLLM keeps the KV of every full block of prompt + output[:-1], with no state behind it.
            depth = seq.num_computed_tokens // self.policy.checkpoint_block * self.policy.checkpoint_block
            if depth:
                node, _ = self.tree.insert(seq.token_ids, seq.block_table, depth, seq.cache_salt)
                self._stamp(node, self.clock())
        if seq.cache_handle is not None:
            self._lock(seq.cache_handle, -1)
            seq.cache_handle = None
        self._live.pop(id(seq), None)
        self._spare.pop(id(seq), None)
        self.block_pool.free(seq.block_table)
        seq.block_table = []
        if seq.state_slot is not None:
            self.state_pool.free(seq.state_slot)
            seq.state_slot = None

    def preempt(self, seq: Sequence) -> bool:
        """Release a preempted running sequence, leaving its hybrid state at its position as a cache unit:
        its working slot (the state after token num_computed_tokens - 1) becomes a checkpoint at that depth
        over its KV blocks, admitted and priced like any checkpoint (and written back to the host tier like
        a request's end), so its re-admission resumes there as a prefix hit. True when the unit was kept;
        False (everything released, nothing kept) without a prefix cache, with the vLLM page pool, with
        nothing computed, or when the admission rule refused the unit."""
        depth = seq.num_computed_tokens
        if not self.enabled or self.pages is not None or not depth or seq.state_slot is None:
            self.release(seq, commit=False)
            return False
        if self.host is not None:
            self.host.write_back(
                seq.token_ids, depth, seq.block_table, seq.state_slot, seq.host_chain, salt=seq.cache_salt
            )
        slot, seq.state_slot = seq.state_slot, None
        kept = self._insert_checkpoint(seq, depth, slot, frontier=True) is not None
        self.release(seq, commit=False)
        return kept

    def reset(self) -> int:
        """Evict every checkpoint no running sequence holds (vLLM's reset_prefix_cache); returns how many."""
        n = 0
        while (victim := self._victim("state")) is not None:
            self._evict(victim, "reset")
            n += 1
        return n

    # ---- host tier hooks ------------------------------------------------------------------------

    def _restore_from_host(self, seq: Sequence, match: Match) -> bool:
        """Start restoring the deepest host state if it is deeper than the GPU hit `match` (locked by the
        caller). KV the GPU tree still holds (whole chunks up to match.kv_depth) is shared; the later
        chunks and the state object are fetched in the background (`seq.restore`, polled by
        `poll_restore`). False (nothing changed) when there is none or no blocks can be had."""
        hit = self.host.lookup(
            seq.token_ids, len(seq.token_ids) - 1, match.depth, seq.host_chain, salt=seq.cache_salt
        )
        if hit is None or hit.depth <= match.depth:
            return False
        first = min(match.kv_depth, hit.depth) // self.host.layout.chunk_tokens
        shared = self.tree.kv_blocks(seq.token_ids, first * self.host.layout.chunk_tokens, seq.cache_salt)
        self.block_pool.incref(shared)  # held before making room: eviction cannot take them
        blocks = self._take_blocks(self.block_pool.blocks_for(hit.depth) - len(shared))
        if blocks is None:
            self.block_pool.free(shared)
            return False
        self._lock(match.node, -1)
        seq.block_table = shared + blocks
        seq.cache_handle = None
        kv_depth = max(match.kv_depth, hit.depth)
        prefetched, seq.prefetch = seq.prefetch, None
        seq.restore = self.host.start_restore(
            hit, first, kv_depth, seq.block_table, seq.state_slot, prefetched
        )
        return True

    def poll_restore(self, seq: Sequence) -> bool | None:
        """A restoring sequence: None while its restore is in flight; True once its blocks and slot hold
        the host state (it continues from the host depth); False when the restore failed (a missing or
        corrupt object, the store unreachable): everything it held is released, it is admitted again."""
        phase = seq.restore.poll()
        if phase is RestorePhase.PENDING:
            return None
        if phase is RestorePhase.FAILED:
            self.release(seq, commit=False)
            return False
        restore, seq.restore = seq.restore, None
        seq.num_computed_tokens = restore.depth
        hit = Match(self.tree.root, restore.depth, restore.kv_depth)
        self._plan(seq, hit)
        self.stats.host_hits += 1
        return True

    # ---- the tree -------------------------------------------------------------------------------

    def _insert_checkpoint(
        self, seq: Sequence, depth: int, slot: int, frontier: bool, spare: bool = False
    ) -> Node | None:
        """Put the state in `slot` into the tree at `depth` of `seq`'s tokens; the node whose checkpoint
        holds it there now (this one, or one already there), None when refused. `spare`: a spare export's,
        evicted before anything else until a request hits it (one already there, or landing on a spare one,
        is not spare)."""
        now = self.clock()
        if self.pages is not None and not self.pages.holds_state(seq.token_ids, depth, seq.cache_salt):
            self.state_pool.free(slot)  # already evicted from the emulated pool
            return None
        node, _ = self.tree.insert(seq.token_ids, seq.block_table, depth, seq.cache_salt)
        if node.slot is not None:  # already checkpointed (another request got here first)
            self.state_pool.free(slot)
            node.frontier |= frontier
            self._stamp(node, now)
            self._spare_nodes.pop(id(node), None)
            return node
        node.slot, node.frontier = slot, frontier
        self.index.slot_changed(node)
        self.num_checkpoints += 1
        self._stamp(node, now)
        while self.num_checkpoints > self.max_checkpoints or not self._chargeable(0, 0):
            victim = self._victim("state" if self.byte_budget is None else "unit", exclude=node)
            spare_victim = victim is not None and id(victim) in self._spare_nodes
            if victim is None or (not spare_victim and self._key(node, now) < self._key(victim, now)):
                self.stats.admissions_refused += 1
                self._evict(node, "refused")
                self._update_gauges()
                return None
            self._evict(victim, "capacity_state")
        if spare:
            self._spare_nodes[id(node)] = node
        self._update_gauges()
        return node

    def _key(self, node: Node, now: float) -> tuple[bool, float]:
        return self.policy.unit_key(self.tree, node, now)

    def _victim(self, kind: str, exclude: Node | None = None) -> Node | None:
        """The oldest unlocked spare checkpoint (for "kv", a leaf: the others free no block), else the
        index's victim of `kind`."""
        if self.index is None:  # prefix caching off: the tree holds nothing
            return None
        for node in self._spare_nodes.values():
            if node.lock == 0 and node is not exclude and (kind != "kv" or node.is_leaf):
                return node
        return self.index.victim(kind, self.clock(), exclude)

    def _stamp(self, node: Node, now: float) -> None:
        self.policy.stamp(node, now)
        self.index.touched(node)

    def _evict(self, node: Node, reason: str) -> None:
        if self._spare_nodes.pop(id(node), None) is None:  # a spare's eviction was no priced choice
            self.policy.on_evict(node, self.tree.exclusive_blocks(node) if node.is_leaf else 0)
        else:
            reason = "spare"
        if node.slot is not None:
            self.state_pool.free(node.slot)
            node.slot = None
            node.frontier = node.ends_request = node.resumed_at_prompt_end = False
            node.reply = node.retry_point = None
            self.index.slot_changed(node)
            self.num_checkpoints -= 1
        self.stats.evictions[reason] += 1
        while node.is_leaf and node.slot is None and node.lock == 0 and node.parent is not None:
            parent = node.parent
            self.tree.remove_leaf(node)
            node = parent
        self._update_gauges()

    def _take_blocks(self, n: int) -> list[int] | None:
        return self.block_pool.allocate(n) if self.make_room(n) else None

    def _take_slot(self, charged: bool = False) -> int | None:
        """A free slot; `charged` (an export, which becomes a checkpoint) must also fit the shared budget."""
        while self.state_pool.num_free == 0 or (charged and not self._chargeable(0, 1)):
            kind = "unit" if charged and self.byte_budget is not None else "state"
            victim = self._victim(kind) if self.enabled else None
            if victim is None:
                return None
            self._evict(victim, "capacity_state")
        return self.state_pool.allocate()

    def _lock(self, node: Node, delta: int) -> None:
        for n in node.path():
            n.lock += delta
            assert n.lock >= 0
            if n.lock == 0 or n.lock == delta:  # dropped, or taken
                self.index.lock_changed(n)

    def _update_gauges(self) -> None:
        self.stats.checkpoints = self.num_checkpoints
        self.stats.checkpoint_bytes = self.num_checkpoints * (
            self.policy.bytes_per_slot if self.policy else 0
        )

    # ---- invariants -----------------------------------------------------------------------------

    def check_integrity(self, live: list[Sequence]) -> None:
        """Every block and slot is free or owned by exactly the nodes/sequences that reference it; locks, node
        shapes, the checkpoint count, the shared budget and the vLLM page pool agree with the owners."""
        refs: dict[int, int] = {}
        slots = list(self._inflight)
        locks: dict[int, int] = {}
        for seq in live:
            r = seq.restore
            if r is not None and (
                seq.num_computed_tokens
                or seq.cache_handle is not None
                or r.blocks != seq.block_table
                or len(r.blocks) != self.block_pool.blocks_for(r.depth)
                or r.slot != seq.state_slot
            ):
                raise AssertionError(f"restoring request {seq.request_id} holds the wrong resources")
            for b in seq.block_table:
                refs[b] = refs.get(b, 0) + 1
            if seq.state_slot is not None:
                slots.append(seq.state_slot)
            if seq.cache_handle is not None:
                for n in seq.cache_handle.path():
                    locks[id(n)] = locks.get(id(n), 0) + 1
        count, held = 0, set()
        for node in self.tree.nodes():
            for b in node.blocks:
                refs[b] = refs.get(b, 0) + 1
            if node.slot is not None:
                slots.append(node.slot)
                count += 1
                held.add(id(node))
            bs = self.block_size
            if len(node.blocks) != -(-node.end // bs) - node.start // bs or not node.tokens:
                raise AssertionError(f"node [{node.start}, {node.end}) holds {len(node.blocks)} blocks")
            if node.parent.parent is not None and node.start != node.parent.end:
                raise AssertionError("a node does not start where its parent ends")
            if node.parent.children.get(node.tokens[0]) is not node:
                raise AssertionError("a node is not indexed under its first token")
            if node.is_leaf and node.slot is None and node.lock == 0 and not self.policy.decode_kv:
                raise AssertionError(f"leaf [{node.start}, {node.end}) holds no checkpoint")
            if node.lock != locks.get(id(node), 0):
                raise AssertionError(f"node lock {node.lock} != {locks.get(id(node), 0)} running handles")
        if not held.issuperset(self._spare_nodes):
            raise AssertionError("a spare checkpoint is not a checkpoint of the tree")
        if count != self.num_checkpoints or count > max(self.max_checkpoints, 0) + len(self._inflight):
            raise AssertionError(
                f"{count} checkpoints (counted {self.num_checkpoints}, max {self.max_checkpoints})"
            )
        self.block_pool.check_integrity(refs)
        self.state_pool.check_integrity(slots)
        if self.byte_budget is not None and self.enabled and self.charged_bytes > self.byte_budget:
            raise AssertionError(f"{self.charged_bytes} bytes charged against a budget of {self.byte_budget}")
        if self.pages is not None:
            self._check_pages(live)

    def _check_pages(self, live: list[Sequence]) -> None:
        """The pool's own accounting holds, it holds pages for exactly the live sequences, and every tree
        checkpoint is a state the pool holds."""
        self.pages.check_integrity()
        if set(self.pages.requests) != {seq.request_id for seq in live}:
            raise AssertionError(f"pool requests {sorted(self.pages.requests)} != live sequences")
        for node in self.tree.nodes():
            salt = self.tree.salt_of(node)
            if node.slot is not None and not self.pages.holds_state(
                self.tree.path_tokens(node), node.end, salt
            ):
                raise AssertionError(f"checkpoint at {node.end} is not held by the vLLM page pool")
