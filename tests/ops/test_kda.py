import pytest
import torch

from flashstate.ops.kda.naive import chunk_kda, fused_recurrent_kda

H, K, V = 2, 8, 6
OPS = [chunk_kda, fused_recurrent_kda]


def _inputs(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, n, H, K, generator=gen)
    k = torch.randn(1, n, H, K, generator=gen)
    v = torch.randn(1, n, H, V, generator=gen)
    g = -torch.rand(1, n, H, K, generator=gen) * 0.3  # per-channel decay in (0.74, 1]
    beta = torch.rand(1, n, H, generator=gen)
    return q, k, v, g, beta


def _cat(parts):
    return [torch.cat(xs, dim=1) for xs in zip(*parts, strict=True)]


def _run(op, xs, lens, pool, slots, has_init, exports=None, chunk_size=64):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    return op(
        *xs, state_pool=pool, state_indices=torch.tensor(slots), has_initial_state=torch.tensor(has_init),
        cu_seqlens=cu, export_token_ids=None if exports is None else torch.tensor(exports),
        use_qk_l2norm_in_kernel=True, chunk_size=chunk_size,
    )


def _sliced(xs, a, b):
    return [x[:, a:b] for x in xs]


def test_chunk_and_recurrent_agree_on_a_varlen_batch_with_initial_states():
    lens = [150, 1, 64, 37]
    seqs = [_inputs(n, seed=i) for i, n in enumerate(lens)]
    init = torch.randn(8, H, K, V)
    slots, has_init = [5, 2, 7, 0], [True, False, True, True]
    results = []
    for op in OPS:
        pool = init.clone()
        o, _ = _run(op, _cat(seqs), lens, pool, slots, has_init)
        results.append((o, pool))
    (o_c, pool_c), (o_r, pool_r) = results
    torch.testing.assert_close(o_c, o_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool_c, pool_r, rtol=1e-5, atol=1e-5)
    untouched = [1, 3, 4, 6]
    torch.testing.assert_close(pool_c[untouched], init[untouched], rtol=0, atol=0)
    assert o_c.shape == (1, sum(lens), H, V)


@pytest.mark.parametrize("op", OPS)
def test_span_split_in_two_calls_equals_one_call(op):
    lens, cuts = [130, 40], [71, 1]
    seqs = [_inputs(n, seed=10 + i) for i, n in enumerate(lens)]
    pool_one = torch.zeros(6, H, K, V)
    o_one, _ = _run(op, _cat(seqs), lens, pool_one, [4, 1], [False, False])
    pool = torch.full((6, H, K, V), float("nan"))  # garbage: has_initial_state=False must ignore it
    first = [_sliced(s, 0, c) for s, c in zip(seqs, cuts, strict=True)]
    second = [_sliced(s, c, n) for s, c, n in zip(seqs, cuts, lens, strict=True)]
    o1, _ = _run(op, _cat(first), cuts, pool, [4, 1], [False, False])
    rest = [n - c for n, c in zip(lens, cuts, strict=True)]
    o2, _ = _run(op, _cat(second), rest, pool, [4, 1], [True, True])
    got = torch.cat([o1[:, :71], o2[:, :59], o1[:, 71:], o2[:, 59:]], dim=1)
    torch.testing.assert_close(got, o_one, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool[[4, 1]], pool_one[[4, 1]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", OPS)
def test_exports_equal_the_state_of_a_run_stopped_there(op):
    lens = [150, 9, 70]
    seqs = [_inputs(n, seed=20 + i) for i, n in enumerate(lens)]
    init = torch.randn(4, H, K, V)
    # (sequence, tokens processed): inside the first chunk, at and across chunk ends, the span end.
    wanted = [(0, 1), (0, 13), (0, 64), (0, 65), (0, 100), (0, 150), (1, 9), (1, 4), (2, 70), (2, 33)]
    cu = [0, 150, 159, 229]
    pool = init.clone()
    _, exported = _run(op, _cat(seqs), lens, pool, [0, 1, 2], [True, False, True],
                       exports=[cu[s] + n - 1 for s, n in wanted])
    for e, (s, n) in enumerate(wanted):
        stopped = init.clone()
        _run(op, _sliced(seqs[s], 0, n), [n], stopped, [s], [s != 1])
        torch.testing.assert_close(exported[e], stopped[s], rtol=1e-5, atol=1e-5)
    assert exported[5].equal(pool[0]) and exported[6].equal(pool[1]) and exported[8].equal(pool[2])


def test_chunk_size_does_not_change_the_result():
    xs = _inputs(100, seed=3)
    results = []
    for chunk_size in (64, 16, 7):
        pool = torch.zeros(1, H, K, V)
        o, e = _run(chunk_kda, xs, [100], pool, [0], [False], exports=[40], chunk_size=chunk_size)
        results.append((o, e, pool))
    for o, e, pool in results[1:]:
        torch.testing.assert_close(o, results[0][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(e, results[0][1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool, results[0][2], rtol=1e-5, atol=1e-5)


def test_matches_the_recurrence_written_out():
    """A hand-written token loop (decay, delta-rule write, read), independent of both ops."""
    q, k, v, g, beta = _inputs(20, seed=4)
    s = torch.randn(H, K, V)
    pool = s[None].clone()
    o, _ = _run(chunk_kda, (q, k, v, g, beta), [20], pool, [0], [True])
    qn = q[0] / torch.sqrt((q[0] ** 2).sum(-1, keepdim=True) + 1e-6) * K**-0.5
    kn = k[0] / torch.sqrt((k[0] ** 2).sum(-1, keepdim=True) + 1e-6)
    for t in range(20):
        for h in range(H):
            s[h] = torch.diag(g[0, t, h].exp()) @ s[h]
            s[h] = s[h] + beta[0, t, h] * torch.outer(kn[t, h], v[0, t, h] - s[h].T @ kn[t, h])
            torch.testing.assert_close(o[0, t, h], s[h].T @ qn[t, h], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool[0], s, rtol=1e-5, atol=1e-5)
