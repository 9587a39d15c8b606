import pytest

from flashstate.bench.prompts import (
    BlockTokens,
    PromptBuilder,
    Segment,
    TurnPlan,
    auto_length_scale,
    context_len,
    plan_turn,
    scaled,
    to_messages,
    truncate,
)
from flashstate.bench.workloads import Request, Session, load_agentx


def test_same_hash_same_tokens_across_instances_and_scopes():
    a, b = BlockTokens(8, seed=3), BlockTokens(8, seed=3, cache_blocks=1)
    assert a.block("s", 7) == b.block("s", 7) == a.block("s", 7)
    assert len(a.block("s", 7)) == 8 and all(0 <= t < 2045 for t in a.block("s", 7))
    assert a.block("s", 7) != a.block("s", 8)
    assert a.block("s", 7) != a.block("other", 7)  # local hash ids: sessions do not share blocks
    assert a.block("s", 7) != BlockTokens(8, seed=4).block("s", 7)


def test_span_crosses_blocks_and_tail():
    bt = BlockTokens(4)
    whole = bt.block("s", 1) + bt.block("s", 2) + bt.tail("s", 2, 2)
    assert bt.span("s", (1, 2), 0, 10) == whole[:10]
    assert bt.span("s", (1, 2), 3, 9) == whole[3:9]
    assert bt.span("s", (), 0, 3) == bt.tail("s", None, 0)[:3]


def test_plan_turn_extend_rewrite_and_minimum():
    prev = Request(10, 3, (1, 2))
    # The trace extends the previous prompt: the whole context (prompt + output) is kept.
    assert plan_turn(13, prev, Request(20, 1, (1, 2, 3, 4, 5)), 20, 4) == TurnPlan(13, 7)
    # The trace rewrote the prompt after block 1: keep that block only.
    assert plan_turn(13, prev, Request(20, 1, (1, 9, 10, 11, 12)), 20, 4) == TurnPlan(4, 16)
    # The output outgrew the recorded growth: still one new token.
    assert plan_turn(13, prev, Request(12, 1, (1, 2, 3)), 12, 4) == TurnPlan(13, 1)
    assert plan_turn(0, None, prev, 10, 4) == TurnPlan(0, 10)


def _replay_contexts(session: Session, builder: PromptBuilder, outputs: bool):
    """The prompts an agent lane sends (no server: outputs are fake ids when `outputs`)."""
    context, prev, prompts = [], None, []
    for req in session.requests:
        context, plan = builder.next_context(context, session.scope, prev, req)
        prompts.append(([t for s in context for t in s.ids], plan))
        if outputs:
            context.append(Segment("assistant", [9999] * builder.output_len(req)))
        prev = req
    return prompts


def test_deltas_on_generated_session():
    s = Session(
        "x",
        (Request(10, 3, (1, 2)), Request(20, 2, (1, 2, 3, 4, 5)), Request(22, 1, (1, 7, 8, 9, 10))),
        4,
        "x",
    )
    b = PromptBuilder(BlockTokens(4))
    (p0, _), (p1, plan1), (p2, plan2) = _replay_contexts(s, b, outputs=True)
    assert len(p0) == 10 and p0 == b.blocks.span("x", (1, 2), 0, 10)
    assert (
        p1[:13] == p0 + [9999] * 3 and plan1 == TurnPlan(13, 7) and len(p1) == 20
    )  # prompt + output + delta
    assert p1[13:] == b.blocks.span("x", (1, 2, 3, 4, 5), 13, 20)  # the delta: turn 1's own blocks
    assert p2[:4] == p0[:4] and plan2 == TurnPlan(4, 18) and len(p2) == 22  # rewritten after block 0


def test_length_scale_shrinks_blocks_and_lengths():
    b = PromptBuilder(BlockTokens(scaled(64, 0.05)), 0.05)
    assert b.blocks.tokens_per_block == 3
    assert (b.input_len(Request(1000, 100, ())), b.output_len(Request(1000, 100, ()))) == (50, 5)
    assert b.output_len(Request(10, 0, ())) == 1


def test_truncate_and_chat_messages():
    ctx = [Segment("user", [1, 2, 3]), Segment("assistant", [0, 0], "hi there"), Segment("user", [4])]
    assert context_len(truncate(ctx, 4)) == 4 and truncate(ctx, 4)[1].text is None
    msgs = to_messages(ctx)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"] and msgs[1]["content"] == "hi there"
    assert len(msgs[0]["content"].split()) == 3
    # A cut assistant turn drops out; the user spans around it merge into one message.
    assert [m["role"] for m in to_messages(truncate(ctx, 4) + [Segment("user", [5])])] == ["user"]
    assert to_messages([Segment("user", [7])]) == to_messages([Segment("user", [7])])


def test_auto_length_scale():
    s = Session("x", (Request(900, 100, ()),), 64)
    assert auto_length_scale([s], 500) == pytest.approx(0.5)
    assert auto_length_scale([s], 5000) == 1.0


def test_real_trace_deltas(traces):
    """Replayed without echoed outputs, a turn re-sends the previous prompt (up to the block the trace
    rewrote, if it did) and adds the trace's new blocks; its length is the recorded `in`. Two sessions
    never share content (local hash ids)."""
    (s,) = load_agentx(traces / "trace_0001.json.gz")
    s = Session(s.id, s.requests[:12], s.block_size, s.scope)
    b = PromptBuilder(BlockTokens(64))
    prompts = _replay_contexts(s, b, outputs=False)
    rewrites = 0
    for (p, _), (q, plan), prev, req in zip(prompts, prompts[1:], s.requests, s.requests[1:], strict=False):
        shared = next(
            (i for i, (x, y) in enumerate(zip(prev.hash_ids, req.hash_ids, strict=False)) if x != y), None
        )
        assert plan.kept == (len(p) if shared is None else shared * 64)
        rewrites += shared is not None
        assert q[: plan.kept] == p[: plan.kept] and len(q) == req.input_len
        assert q[plan.kept :] == b.blocks.span(s.scope, req.hash_ids, plan.kept, req.input_len)
    assert 0 < rewrites < 11
    # Same hash → same tokens: the first 10 blocks of turn 5 equal those of turn 0.
    assert prompts[5][0][:640] == prompts[0][0][:640]
    (other,) = load_agentx(traces / "trace_0007.json.gz")
    assert b.blocks.span(other.scope, other.requests[0].hash_ids, 0, 64) != prompts[0][0][:64]
