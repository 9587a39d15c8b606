import pytest
import torch

from flashstate.ops.ssd.naive import chunk_ssd, fused_recurrent_ssd

H, P, G, N = 4, 3, 2, 5
CHUNK = 8
LIMIT = (0.05, float("inf"))
OPS = {"chunk": lambda *a, **k: chunk_ssd(*a, chunk_size=CHUNK, **k), "recurrent": fused_recurrent_ssd}


def _inputs(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    return dict(
        x=torch.randn(1, t, H, P, generator=g),
        dt=torch.randn(1, t, H, generator=g),
        A=-torch.empty(H).uniform_(0.05, 2.0, generator=g),
        B=torch.randn(1, t, G, N, generator=g),
        C=torch.randn(1, t, G, N, generator=g),
        D=torch.randn(H, generator=g),
        dt_bias=torch.randn(H, generator=g) - 1.0,
    )


def _run(op, inp, pool, slots, has_init, lengths, export_ids=None):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    x, dt, A, B, C, D = (inp[k] for k in ("x", "dt", "A", "B", "C", "D"))
    return OPS[op](
        x, dt, A, B, C, D, dt_bias=inp["dt_bias"], dt_limit=LIMIT, state_pool=pool,
        state_indices=torch.tensor(slots), has_initial_state=torch.tensor(has_init), cu_seqlens=cu,
        export_token_ids=None if export_ids is None else torch.tensor(export_ids),
    )


def _slice(inp, start, end):
    return {k: (v[:, start:end] if v.dim() > 1 else v) for k, v in inp.items()}


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_chunk_equals_recurrent_and_hf_chunk_scan():
    lengths = [21, 5, 16, 1]
    inp = _inputs(lengths)
    init = torch.randn(4, H, P, N)
    outs = {}
    for op in OPS:
        pool = init.clone()
        y, _ = _run(op, inp, pool, [3, 0, 2, 1], [True, False, True, True], lengths)
        outs[op] = (y, pool)
    torch.testing.assert_close(outs["chunk"][0], outs["recurrent"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["chunk"][1], outs["recurrent"][1], rtol=1e-5, atol=1e-5)
    # The first sequence against transformers' own torch SSD (mamba2_chunk_scan, batch 1, initial state).
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan

    s = _slice(inp, 0, 21)
    y_hf, final_hf = mamba2_chunk_scan(
        s["x"], s["dt"], s["A"], s["B"], s["C"], chunk_size=CHUNK, D=s["D"], dt_bias=s["dt_bias"],
        initial_states=init[3][None], dt_softplus=True, dt_limit=LIMIT, return_final_states=True,
    )
    assert _rel(outs["chunk"][0][:, :21], y_hf) < 1e-5
    assert _rel(outs["chunk"][1][3], final_hf[0]) < 1e-5


@pytest.mark.parametrize("op", list(OPS))
def test_span_split_in_two_calls_equals_one_call(op):
    lengths, cut = [23, 6, 17], [10, 1, 8]
    slots = [4, 1, 3]  # not the identity
    inp = _inputs(lengths, seed=1)
    pool_one = torch.zeros(6, H, P, N)
    y_one, _ = _run(op, inp, pool_one, slots, [False] * 3, lengths)

    starts = [0, 23, 29]
    spans = list(zip(starts, cut, lengths, strict=True))
    keys = ("x", "dt", "B", "C")
    first = {k: torch.cat([_slice(inp, s, s + c)[k] for s, c, _ in spans], dim=1) for k in keys}
    rest = {k: torch.cat([_slice(inp, s + c, s + n)[k] for s, c, n in spans], dim=1) for k in keys}
    shared = {k: inp[k] for k in ("A", "D", "dt_bias")}
    pool = torch.randn(6, H, P, N) * 100  # garbage: has_initial_state=False must ignore it
    y1, _ = _run(op, first | shared, pool, slots, [False] * 3, cut)
    y2, _ = _run(op, rest | shared, pool, slots, [True] * 3, [n - c for _, c, n in spans])
    o1 = o2 = 0
    for s, c, n in spans:
        assert _rel(y1[:, o1:o1 + c], y_one[:, s:s + c]) < 1e-6
        assert _rel(y2[:, o2:o2 + n - c], y_one[:, s + c:s + n]) < 1e-5
        o1, o2 = o1 + c, o2 + n - c
    for slot in slots:
        assert _rel(pool[slot], pool_one[slot]) < 1e-5


@pytest.mark.parametrize("op", list(OPS))
def test_exports_equal_state_of_run_stopped_there(op):
    lengths = [29, 7, 12]
    inp = _inputs(lengths, seed=2)
    init = torch.randn(5, H, P, N)
    slots, has_init = [2, 0, 4], [True, False, True]
    # Flat positions: inside the first chunk, past chunk ends (not multiples of 8 or 4), span ends.
    wanted = [(0, 3), (0, 11), (0, 17), (0, 29), (1, 1), (1, 7), (2, 5), (2, 9), (2, 12)]
    starts = [0, 29, 36]
    export_ids = [starts[i] + n - 1 for i, n in wanted]
    pool = init.clone()
    _, exported = _run(op, inp, pool, slots, has_init, lengths, export_ids)
    assert exported.shape == (len(wanted), H, P, N)
    for e, (i, n) in enumerate(wanted):
        stopped = init.clone()
        _run(op, _slice(inp, starts[i], starts[i] + n), stopped, [slots[i]], [has_init[i]], [n])
        assert _rel(exported[e], stopped[slots[i]]) < 1e-5, (i, n)
    # An export at a span end is the final state written back to the pool.
    assert _rel(exported[3], pool[2]) < 1e-6


@pytest.mark.parametrize("op", list(OPS))
def test_no_initial_state_ignores_garbage(op):
    lengths = [13, 4]
    inp = _inputs(lengths, seed=3)
    clean, dirty = torch.zeros(3, H, P, N), torch.full((3, H, P, N), 1e4)
    y_clean, e_clean = _run(op, inp, clean, [1, 2], [False, False], lengths, [5, 13])
    y_dirty, e_dirty = _run(op, inp, dirty, [1, 2], [False, False], lengths, [5, 13])
    torch.testing.assert_close(y_dirty, y_clean, rtol=0, atol=0)
    torch.testing.assert_close(e_dirty, e_clean, rtol=0, atol=0)
    torch.testing.assert_close(dirty[1:], clean[1:], rtol=0, atol=0)
    assert (dirty[0] == 1e4).all()  # untouched slot


def test_dt_limit_is_applied():
    lengths = [9]
    inp = _inputs(lengths, seed=4)
    pool_a, pool_b = torch.zeros(1, H, P, N), torch.zeros(1, H, P, N)
    y_a, _ = _run("chunk", inp, pool_a, [0], [False], lengths)
    cu = torch.tensor([0, 9])
    y_b, _ = chunk_ssd(
        inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["D"], dt_bias=inp["dt_bias"],
        state_pool=pool_b, state_indices=torch.tensor([0]), has_initial_state=torch.tensor([False]),
        cu_seqlens=cu, chunk_size=CHUNK,
    )
    assert _rel(y_a, y_b) > 1e-3  # some Δ fall under the 0.05 floor in these inputs
