import pytest
import torch
import torch.nn.functional as F

from flashstate.ops.gated_delta_rule.naive import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

HK, HV, K, V = 2, 4, 8, 6
OPS = [chunk_gated_delta_rule, fused_recurrent_gated_delta_rule]


def _inputs(lens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q = torch.randn(1, t, HK, K, generator=gen)
    k = torch.randn(1, t, HK, K, generator=gen)
    v = torch.randn(1, t, HV, V, generator=gen)
    g = -F.softplus(torch.randn(1, t, HV, generator=gen)) * 0.3
    beta = torch.rand(1, t, HV, generator=gen)
    return q, k, v, g, beta


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])


def _call(op, x, lens, pool, slots, has_init, export_ids=None):
    return op(
        *x, state_pool=pool, state_indices=torch.tensor(slots), has_initial_state=torch.tensor(has_init),
        cu_seqlens=_cu(lens), export_token_ids=None if export_ids is None else torch.tensor(export_ids),
        use_qk_l2norm_in_kernel=True,
    )


def _pick(x, spans):
    """Concatenate token ranges [(start, end), ...] of every tensor in x."""
    return tuple(torch.cat([t[:, a:b] for a, b in spans], dim=1) for t in x)


def _close(a, b, tol=1e-5):
    err = float((a - b).norm() / b.norm().clamp_min(1e-30))
    assert err <= tol, err


def test_chunk_matches_recurrent_with_initial_states():
    lens = [150, 37, 1, 64, 65]
    x = _inputs(lens)
    init = torch.randn(8, HV, K, V)
    slots, has_init = [6, 0, 3, 1, 4], [True, False, True, True, False]
    pools = [init.clone(), init.clone()]
    (o_c, _), (o_r, _) = (_call(op, x, lens, p, slots, has_init) for op, p in zip(OPS, pools, strict=True))
    _close(o_c, o_r)
    _close(pools[0], pools[1])
    assert o_c.shape == (1, sum(lens), HV, V)
    assert not torch.equal(pools[0][slots], init[slots])  # final states were written back


def test_matches_hf_reference_per_sequence():
    import transformers.models.qwen3_next.modeling_qwen3_next as hf
    lens = [100]
    x = _inputs(lens, seed=1)
    init = torch.randn(1, HV, K, V)
    pool = init.clone()
    o, _ = _call(chunk_gated_delta_rule, x, lens, pool, [0], [True])
    ref, ref_state = hf.torch_chunk_gated_delta_rule(
        *x, initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    _close(o, ref)
    _close(pool, ref_state)


@pytest.mark.parametrize("op", OPS)
def test_span_split_in_two_calls_equals_one_call(op):
    lens, cut = [150, 9, 70], [77, 4, 1]
    x = _inputs(lens, seed=2)
    cu = _cu(lens).tolist()
    slots = [5, 2, 7]  # non-identity slots; the pool carries the state between calls
    whole_pool = torch.zeros(8, HV, K, V)
    o_whole, _ = _call(op, x, lens, whole_pool, slots, [False] * 3)
    pool = torch.full((8, HV, K, V), float("nan"))
    first = [(cu[i], cu[i] + c) for i, c in enumerate(cut)]
    second = [(cu[i] + c, cu[i + 1]) for i, c in enumerate(cut)]
    o1, _ = _call(op, _pick(x, first), cut, pool, slots, [False] * 3)
    rest = [n - c for n, c in zip(lens, cut, strict=True)]
    o2, _ = _call(op, _pick(x, second), rest, pool, slots, [True] * 3)
    pairs = zip(o1.split(cut, dim=1), o2.split(rest, dim=1), strict=True)
    o_split = torch.cat([torch.cat([a, b], dim=1) for a, b in pairs], dim=1)
    _close(o_split, o_whole)
    _close(pool[slots], whole_pool[slots])


@pytest.mark.parametrize("op", OPS)
def test_exports_equal_states_of_runs_stopped_there(op):
    lens = [150, 37, 70]
    x = _inputs(lens, seed=3)
    cu = _cu(lens).tolist()
    # (sequence, tokens processed): first token, inside the first chunk, across chunk bounds, span ends
    wanted = [(0, 1), (0, 5), (0, 63), (0, 65), (0, 129), (0, 150), (1, 37), (1, 20), (2, 67), (2, 3)]
    init = torch.randn(4, HV, K, V)
    has_init = [True, False, True]
    pool = init.clone()
    _, exported = _call(op, x, lens, pool, [0, 1, 2], has_init, [cu[s] + n - 1 for s, n in wanted])
    assert exported.shape == (len(wanted), HV, K, V)
    for e, (s, n) in enumerate(wanted):
        ref_pool = init.clone()
        _call(op, _pick(x, [(cu[s], cu[s] + n)]), [n], ref_pool, [s], [has_init[s]])
        _close(exported[e], ref_pool[s])


@pytest.mark.parametrize("op", OPS)
def test_no_initial_state_ignores_garbage_in_slot(op):
    lens = [70, 3]
    x = _inputs(lens, seed=4)
    clean, dirty = torch.zeros(4, HV, K, V), torch.full((4, HV, K, V), 1e30)
    dirty[2] = float("nan")
    o_clean, _ = _call(op, x, lens, clean, [1, 2], [False, False])
    o_dirty, _ = _call(op, x, lens, dirty, [1, 2], [False, False])
    torch.testing.assert_close(o_dirty, o_clean, rtol=0, atol=0)
    torch.testing.assert_close(dirty[[1, 2]], clean[[1, 2]], rtol=0, atol=0)
