import math
import random
from dataclasses import replace

import numpy as np
import pytest

from flashstate.bench.prompts import common_prefix
from flashstate.bench.synthetic import fit, generate, observe, session_stream
from flashstate.bench.synthetic_config import PROBS, Quantiles
from flashstate.bench.synthetic_defaults import DEFAULT


def test_quantiles_sample_cdf_mean_and_fit_roundtrip():
    q = Quantiles(tuple(float(2 ** (20 * p)) for p in PROBS))  # log-uniform on [1, 2^20]
    rng = random.Random(0)
    xs = [q.sample(rng) for _ in range(4000)]
    assert min(xs) >= 1.0 and max(xs) <= 2.0**20
    assert np.median(xs) == pytest.approx(2.0**10, rel=0.15)
    assert all(q.cdf(q.at(u)) == pytest.approx(u) for u in (0.0, 0.05, 0.33, 0.5, 0.97, 1.0))
    assert q.mean() == pytest.approx((2.0**20 - 1) / math.log(2.0**20), rel=1e-6)
    assert Quantiles((3.0,) * len(PROBS)).mean() == 3.0
    refit = Quantiles.fit(xs).points
    assert all(abs(math.log2(a / b)) < 0.5 for a, b in zip(refit[1:-1], q.points[1:-1], strict=True))


def test_generate_is_deterministic_and_seeded():
    a, b = generate(DEFAULT, 3, seed=1), generate(DEFAULT, 3, seed=1)
    assert a == b
    assert generate(DEFAULT, 3, seed=2) != a
    stream = session_stream(DEFAULT, seed=1)
    assert [next(stream) for _ in range(3)] == a


def test_generated_sessions_have_agentx_shape():
    sessions = generate(DEFAULT, 40, seed=0)
    prefix = DEFAULT.main.prefix_tokens // 64
    first_blocks = {s.requests[0].hash_ids[:prefix] for s in sessions}
    assert len(first_blocks) == 1  # every agent starts with the shared tools + system prompt
    rewrites = extends = 0
    for s in sessions:
        assert s.scope == "" and s.block_size == 64 and s.requests
        for a, b in zip(s.requests, s.requests[1:], strict=False):
            assert len(b.hash_ids) == b.input_len // 64 and b.hash_ids[:prefix] == a.hash_ids[:prefix]
            if common_prefix(a.hash_ids, b.hash_ids) == len(a.hash_ids):
                extends += 1
                assert b.input_len > a.input_len + a.output_len  # the output stays, new tokens follow
            else:
                rewrites += 1
    assert extends > 5 * rewrites > 0
    others = {h for s in sessions[1:] for r in s.requests for h in r.hash_ids[prefix:]}
    assert not others & set(sessions[0].requests[-1].hash_ids[prefix:])  # private beyond the prefix


def test_generator_reproduces_its_statistics():
    sessions = generate(DEFAULT, 300, seed=0)
    s = observe(sessions)
    for key in ("output", "think_tool", "new_tokens", "turns", "first_context", "peak_context"):
        assert np.median(s[key]) == pytest.approx(getattr(DEFAULT.main, key).at(0.5), rel=0.15), key
    assert np.mean(s["user_turn"]) == pytest.approx(DEFAULT.main.user_turn_prob, abs=0.03)
    # Rewrites: the fitted ones plus compactions when a session outgrows its window (7.1 % in the traces).
    assert DEFAULT.main.rewrite_prob <= np.mean(s["rewrite"]) < DEFAULT.main.rewrite_prob + 0.03
    turns, first = np.log(s["turns"]), np.log(s["first_context"])
    assert np.corrcoef(turns, first)[0, 1] < -0.2  # long sessions start small


def test_subagents_share_their_own_prefix():
    cfg = replace(DEFAULT, subagent_prob=0.5)
    sessions = generate(cfg, 4, seed=0)
    subs = [a for s in sessions for r in s.requests for a in r.subagents]
    assert len(subs) > 4
    n = cfg.sub.prefix_tokens // 64
    assert len({a.requests[0].hash_ids[:n] for a in subs}) == 1
    assert subs[0].requests[0].hash_ids[0] not in sessions[0].requests[0].hash_ids
    assert all(a.requests[0].think_time == cfg.sub.start_delay for a in subs)
    assert observe(sessions, depth=1)["turns"]


def test_defaults_are_the_fit_of_the_real_traces(real_sessions):
    assert fit(real_sessions) == DEFAULT
