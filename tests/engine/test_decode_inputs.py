"""The persistent decode inputs equal what ForwardMetadata.build makes from scratch, step after step, as
sequences advance, grow their block tables, are replaced, reordered, leave and join the batch."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from flashstate.engine.worker.decode_inputs import DecodeInputs
from flashstate.layers.metadata import ForwardMetadata

BLOCK = 4
PAD_BLOCK, PAD_SLOT = 99, 77


def _seq(rng: random.Random, slot: int) -> SimpleNamespace:
    computed = rng.randint(0, 30)
    table = [rng.randrange(90) for _ in range(computed // BLOCK + 1)]
    tokens = [rng.randrange(1000) for _ in range(computed + 1)]
    return SimpleNamespace(block_table=table, num_computed_tokens=computed, token_ids=tokens, state_slot=slot)


def _advance(rng: random.Random, seq: SimpleNamespace) -> None:
    """What a decode step does to a sequence: one more computed token, one more sampled, a block when full."""
    seq.num_computed_tokens += 1
    seq.token_ids.append(rng.randrange(1000))
    if len(seq.block_table) * BLOCK <= seq.num_computed_tokens:
        seq.block_table.append(rng.randrange(90))


def _check(inputs: DecodeInputs, seqs: list, bs: int) -> None:
    n = len(seqs)
    want = ForwardMetadata.build(
        query_lens=[1] * n,
        context_lens=[s.num_computed_tokens + 1 for s in seqs],
        block_tables=[s.block_table for s in seqs],
        block_size=BLOCK,
        state_slots=[s.state_slot for s in seqs],
        has_initial_state=[s.num_computed_tokens > 0 for s in seqs],
    )
    got = inputs.metadata(bs)
    for name in ("positions", "context_lens", "slot_mapping", "state_slots", "has_initial_state"):
        assert getattr(got, name)[:n].tolist() == getattr(want, name).tolist(), name
    assert inputs.input_ids(bs)[:n].tolist() == [s.token_ids[s.num_computed_tokens] for s in seqs]
    for i, s in enumerate(seqs):
        assert got.block_tables[i, : len(s.block_table)].tolist() == s.block_table
    # padding rows: token 0 at position 0 into the pad block and slot, no state
    assert got.positions[n:].tolist() == [0] * (bs - n)
    assert got.slot_mapping[n:].tolist() == [PAD_BLOCK * BLOCK] * (bs - n)
    assert got.state_slots[n:].tolist() == [PAD_SLOT] * (bs - n)
    assert not got.has_initial_state[n:].any()
    assert got.block_tables[n:bs, 0].tolist() == [PAD_BLOCK] * (bs - n)


def test_rows_follow_the_batch_through_growth_replacement_reorder_and_membership():
    rng = random.Random(0)
    inputs = DecodeInputs(8, 64, BLOCK, PAD_BLOCK, PAD_SLOT, torch.device("cpu"))
    pool = [_seq(rng, slot) for slot in range(12)]
    batch = pool[:5]
    for _ in range(200):
        for seq in batch:
            _advance(rng, seq)
        event = rng.random()
        if event < 0.1 and len(batch) > 1:
            batch.pop(rng.randrange(len(batch)))  # finished
        elif event < 0.2 and len(batch) < 8:
            outside = [s for s in pool if s not in batch]
            batch.insert(rng.randrange(len(batch) + 1), rng.choice(outside))  # joins (anywhere)
        elif event < 0.25:
            rng.shuffle(batch)
        elif event < 0.3:
            victim = rng.choice(batch)  # preempted and re-admitted: a new table list
            victim.block_table = [rng.randrange(90) for _ in range(len(victim.block_table))]
        bs = rng.choice([b for b in (1, 2, 4, 8) if b >= len(batch)])
        inputs.prepare(batch, bs)
        inputs.upload(bs)
        _check(inputs, batch, bs)
