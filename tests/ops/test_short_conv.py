import torch
import torch.nn.functional as F

from flashstate.ops.short_conv.naive import causal_conv1d


def _reference(x, weight, bias):
    """Whole-sequence causal conv from zeros: [L, D]."""
    k = weight.shape[1]
    xp = F.pad(x.T, (k - 1, 0))
    return F.silu(F.conv1d(xp[None], weight[:, None], bias, groups=x.shape[1])[0].T)


def _run(x, weight, bias, pool, slots, has_init, lens, export_ids=None):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    return causal_conv1d(
        x,
        weight,
        bias,
        conv_state_pool=pool,
        state_indices=torch.tensor(slots),
        has_initial_state=torch.tensor(has_init),
        cu_seqlens=cu,
        export_token_ids=None if export_ids is None else torch.tensor(export_ids),
    )


def test_split_spans_equal_whole_sequence_and_exports_match_stopped_runs():
    torch.manual_seed(0)
    d, k = 6, 4
    weight, bias = torch.randn(d, k), torch.randn(d)
    seqs = [torch.randn(n, d) for n in (9, 2, 13)]
    pool = torch.zeros(8, d, k - 1)
    # First pass: each sequence's first part, exporting at arbitrary offsets.
    cut = [5, 1, 7]
    x = torch.cat([s[:c] for s, c in zip(seqs, cut, strict=False)])
    y1, exp = _run(x, weight, bias, pool, [0, 1, 2], [False] * 3, cut, export_ids=[1, 5, 6 + 4])
    y2, _ = _run(
        torch.cat([s[c:] for s, c in zip(seqs, cut, strict=False)]),
        weight,
        bias,
        pool,
        [0, 1, 2],
        [True] * 3,
        [len(s) - c for s, c in zip(seqs, cut, strict=False)],
    )
    got = []
    o1 = o2 = 0
    for s, c in zip(seqs, cut, strict=False):
        got.append(torch.cat([y1[o1 : o1 + c], y2[o2 : o2 + len(s) - c]]))
        o1 += c
        o2 += len(s) - c
    for s, g in zip(seqs, got, strict=False):
        torch.testing.assert_close(g, _reference(s, weight, bias), rtol=1e-6, atol=1e-6)
    # Exported state after token 2 of seq 0 = its first two inputs, left-padded with zeros.
    torch.testing.assert_close(exp[0], torch.cat([torch.zeros(d, 1), seqs[0][:2].T], dim=1))
    torch.testing.assert_close(exp[2], seqs[2][2:5].T)
    # Final state of seq 1 (length 2) keeps one zero column.
    torch.testing.assert_close(pool[1], torch.cat([torch.zeros(d, 1), seqs[1].T], dim=1))
