"""Where a session resumes: at its last request's end (a client that re-sends each reply token for token),
or at its prompt's end (a chat client whose template re-renders the history: the reasoning dropped, tool
calls re-serialised). The cache manager learns which from each continuation's hit and moves the leaf-last
protection to that checkpoint, or to both while it cannot tell (cache/manager.py), so under a budget a
session's resume point is not crowded out by the checkpoints it left behind.

The engines are the simulator's (the real scheduler and cache manager, pools as counters), as in
tests/cache/test_dominance.py.
"""

from __future__ import annotations

import random

from tests.cache.test_dominance import AMPLE, VOCAB, engine, run_one
from tests.cache.test_spare_exports import WORKING


def fresh(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def checkpoints(sim) -> dict[int, object]:
    return {n.end: n for n in sim.cache.tree.nodes() if n.slot is not None}


def test_a_rerendering_session_moves_its_protection_to_the_prompt_end():
    sim = engine("flashstate", AMPLE, mamba_fallback_checkpoints="retry")
    rng = random.Random(0)
    p0 = fresh(rng, 100)
    _, out0 = run_one(sim, "t0", p0, 8, seed=0)
    end0 = len(p0) + len(out0) - 1  # the last sampled token has no state
    assert checkpoints(sim)[end0].frontier  # nothing known yet: the frontier is the resume point
    p1 = p0 + fresh(rng, 40)  # the reply not re-sent: the prompt leaves its path at p0's end
    cached, out1 = run_one(sim, "t1", p1, 8, seed=1)
    assert cached == len(p0) - 1  # the retry checkpoint
    nodes = checkpoints(sim)
    assert not nodes[end0].frontier  # the reply left behind
    assert not nodes[len(p0) - 1].frontier  # a hit: it has served
    # one departure may be an edit or a branch: this request's end and its retry point are both kept
    assert nodes[len(p1) + len(out1) - 1].frontier and nodes[len(p1) - 1].frontier
    p2 = p1 + fresh(rng, 40)  # left again: the session re-renders
    cached, out2 = run_one(sim, "t2", p2, 8, seed=2)
    assert cached == len(p1) - 1
    nodes = checkpoints(sim)
    assert nodes[len(p2) - 1].frontier  # where this session's next request will resume
    assert not nodes[len(p2) + len(out2) - 1].frontier
    assert not nodes[len(p1) + len(out1) - 1].frontier and not nodes[len(p1) - 1].frontier
    assert sim.cache.rerender_share > 0


def test_a_session_resending_its_replies_keeps_its_frontier():
    sim = engine("flashstate", AMPLE, mamba_fallback_checkpoints="retry")
    rng = random.Random(1)
    p0 = fresh(rng, 100)
    _, out0 = run_one(sim, "t0", p0, 8, seed=0)
    p1 = p0 + out0 + fresh(rng, 40)
    cached, out1 = run_one(sim, "t1", p1, 8, seed=1)
    assert cached == len(p0) + len(out0) - 1
    nodes = checkpoints(sim)
    assert nodes[len(p1) + len(out1) - 1].frontier
    assert not nodes[len(p1) - 1].frontier and not nodes[len(p0) - 1].frontier
    assert not nodes[len(p0) + len(out0) - 1].frontier  # a hit: it has served
    assert sim.cache.rerender_share == 0


def rerendering_sessions(
    budget: int, sessions: int = 6, turns: int = 5, resending: int = 0
) -> list[list[int]]:
    """Cached tokens of each turn of `sessions` chat sessions taking turns round-robin, each re-sending its
    history without the replies but the last `resending`, which re-send theirs token for token."""
    sim = engine("flashstate", budget, mamba_fallback_checkpoints="retry")
    rng = random.Random(2)
    prompts = [fresh(rng, 60) for _ in range(sessions)]
    cached: list[list[int]] = [[] for _ in range(sessions)]
    for turn in range(turns):
        for s in range(sessions):
            if turn:
                prompts[s] = prompts[s] + fresh(rng, 24)
            hit, out = run_one(sim, f"s{s}t{turn}", prompts[s], 16, seed=turn * sessions + s)
            cached[s].append(hit)
            if s >= sessions - resending:
                prompts[s] = prompts[s] + out
    return cached


def test_rerendering_sessions_resume_at_their_prompt_ends_under_a_budget():
    """A budget that holds each session's resume points but not also every frontier the turns left behind
    (protected, those crowded the resume points out: a third of the continuations resumed lower or nowhere):
    every continuation resumes one token before its previous prompt's end."""
    cached = rerendering_sessions(WORKING + 2600 * 1024)
    for turns in cached:
        for k in range(1, len(turns)):
            assert turns[k] == 60 + 24 * (k - 1) - 1, cached


def test_mixed_sessions_resume_where_each_left_off_under_a_budget():
    """Half the sessions re-render, half re-send their replies (a chat server's agents, some reasoning, some
    not): while the manager cannot tell a session's next move it keeps both resume points, and each session
    keeps the one it uses. Every continuation resumes at its deepest possible point: one token before the
    previous prompt's end, or the previous request's end. (Before hits took the protection off what they
    landed on, the checkpoints the sessions had used crowded 4 of these 24 continuations out.)"""
    cached = rerendering_sessions(WORKING + 1600 * 1024, resending=3)
    for s, turns in enumerate(cached):
        for k in range(1, len(turns)):
            if s < 3:
                assert turns[k] == 60 + 24 * (k - 1) - 1, cached
            else:  # the previous prompt + its 16 output tokens, less the last sampled token
                assert turns[k] == 60 + 40 * (k - 1) + 15, cached


def test_the_retry_point_stands_for_the_message_ends_just_before_it():
    """A chat prompt's last message ends a few tokens before the prompt's end (the generation prompt follows).
    With the retry point exported one token before the end, neither that message end nor the prompt's end
    exports a state of its own; the earlier message ends do."""
    sim = engine("flashstate", AMPLE, mamba_fallback_checkpoints="retry")
    prompt = fresh(random.Random(3), 120)
    sim.add("chat", prompt, 4, 0, hint_positions=[40, 90, 117, 120])
    while sim.has_work:
        batch, seconds = sim.start_step()
        sim.now[0] += seconds + 1e-3
        sim.finish_step(batch)
    depths = set(checkpoints(sim))
    assert {40, 90, 119} <= depths and not {117, 120} & depths
