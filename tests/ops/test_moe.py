"""MoE on the CPU: the oracle against a per-token reference, the routers against brute force, the sorted
assignments' layout, and the expert stacks the fused kernels read (views of the checkpoint parameters)."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flashstate.layers.stacked_experts import StackedExperts
from flashstate.ops.moe import Experts, grouped_topk, moe_experts, softmax_topk
from flashstate.ops.moe import naive as moe_naive
from flashstate.ops.moe.align import align_assignments, padded_length


def _experts(e, d, i, gated, act="silu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w_in = torch.randn(e, 2 * i if gated else i, d, generator=g) / d**0.5
    w_out = torch.randn(e, d, i, generator=g) / i**0.5
    return Experts(w_in.to(dtype), w_out.to(dtype), act, gated)


def _per_token(x, weights, ids, ex):
    """Σ_j w · expert(x[t]), one token and one choice at a time, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t, j in itertools.product(range(ids.shape[0]), range(ids.shape[1])):
        e = int(ids[t, j])
        u = ex.w_in[e].double() @ x[t].double()
        if ex.gated:
            gate, up = u.chunk(2)
            a = F.silu(gate) * up
        else:
            a = F.relu(u).square() if ex.act == "relu2" else F.silu(u)
        out[t] += float(weights[t, j]) * (ex.w_out[e].double() @ a)
    return out


@pytest.mark.parametrize(("gated", "act"), [(True, "silu"), (False, "relu2"), (False, "silu")])
def test_the_oracle_is_the_per_token_sum(gated, act):
    torch.manual_seed(0)
    t, e, k, d, i = 13, 8, 3, 24, 20
    ex = _experts(e, d, i, gated, act)
    x = torch.randn(t, d)
    weights, ids = softmax_topk(torch.randn(t, e), k, renormalize=True)
    got = moe_experts(x, weights, ids, ex)
    assert got.dtype == x.dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), _per_token(x, weights, ids, ex), rtol=1e-5, atol=1e-6)


def test_the_oracle_calls_the_expert_modules_and_sums_in_the_accumulate_dtype():
    torch.manual_seed(1)
    t, e, k, d, i = 9, 4, 2, 16, 8
    ex = _experts(e, d, i, gated=True, dtype=torch.bfloat16)
    calls = []

    def module(e):
        def run(h):
            calls.append(e)
            return moe_naive.stacked_expert(ex, e)(h)

        return run

    x = torch.randn(t, d).bfloat16()
    weights, ids = softmax_topk(torch.randn(t, e), k, renormalize=False)
    via_modules = Experts(ex.w_in, ex.w_out, "silu", True, [module(j) for j in range(e)], torch.float32)
    got = moe_experts(x, weights, ids, via_modules)
    assert calls == sorted(set(ids.flatten().tolist())) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), _per_token(x, weights, ids, ex), rtol=2e-2, atol=2e-2)


def test_experts_refuse_mismatched_stacks_and_unknown_activations():
    ex = _experts(4, 16, 8, gated=True)
    with pytest.raises(ValueError, match="disagree"):
        Experts(ex.w_in, ex.w_out[:, :, :4], "silu", True)
    with pytest.raises(ValueError, match="activation"):
        Experts(ex.w_in, ex.w_out, "gelu", True)


def test_softmax_topk_matches_the_definition():
    torch.manual_seed(2)
    logits = torch.randn(11, 16)
    for renormalize in (False, True):
        weights, ids = softmax_topk(logits.bfloat16(), 4, renormalize)
        probs = logits.bfloat16().float().softmax(-1)
        want = probs.gather(1, ids)
        if renormalize:
            want = want / want.sum(-1, keepdim=True)
        assert weights.dtype == torch.float32 and ids.shape == (11, 4)
        torch.testing.assert_close(weights, want)
        # the k chosen are the k largest
        assert torch.all(probs.gather(1, ids).min(-1).values >= probs.topk(5, -1).values[:, 4] - 1e-7)


def _grouped_reference(scores, bias, k, n_group, topk_group, renormalize, scaling):
    """One token at a time: rank groups by their two best biased scores, pick k in the best groups."""
    ids, weights = [], []
    e = scores.shape[1]
    size = e // n_group
    for s in scores:
        biased = s + bias
        rank = [sorted(biased[g * size : (g + 1) * size].tolist())[-2:] for g in range(n_group)]
        groups = sorted(range(n_group), key=lambda g: -sum(rank[g]))[:topk_group]
        allowed = [j for g in groups for j in range(g * size, (g + 1) * size)]
        chosen = sorted(allowed, key=lambda j: -float(biased[j]))[:k]
        w = s[chosen]
        if renormalize:
            w = w / w.sum()
        ids.append(chosen)
        weights.append(w * scaling)
    return torch.stack(weights), torch.tensor(ids)


def test_grouped_topk_picks_inside_the_best_groups_by_biased_score():
    torch.manual_seed(3)
    scores = torch.rand(10, 16)
    bias = torch.randn(16) * 0.1
    for renormalize in (False, True):
        weights, ids = grouped_topk(scores, bias, 3, 4, 2, renormalize, 2.5)
        want_w, want_ids = _grouped_reference(scores, bias, 3, 4, 2, renormalize, 2.5)
        assert torch.equal(ids.sort(-1).values, want_ids.sort(-1).values)
        order_got, order_want = ids.argsort(-1), want_ids.argsort(-1)
        torch.testing.assert_close(weights.gather(1, order_got), want_w.gather(1, order_want))


@pytest.mark.parametrize(
    ("t", "k", "e", "block"), [(1, 2, 8, 16), (7, 6, 64, 16), (50, 8, 8, 32), (3, 2, 128, 64)]
)
def test_aligned_assignments_are_expert_major_runs_padded_to_the_block(t, k, e, block):
    torch.manual_seed(t)
    ids = torch.rand(t, e).topk(k, -1).indices
    n = t * k
    sorted_ids, block_expert = align_assignments(ids, e, block)
    assert sorted_ids.dtype == block_expert.dtype == torch.int32
    assert sorted_ids.numel() == padded_length(n, e, block) == block_expert.numel() * block
    real = sorted_ids[sorted_ids < n]
    assert sorted(real.tolist()) == list(range(n))  # every assignment exactly once, the rest sentinel
    assert torch.all(sorted_ids <= n)
    flat = ids.flatten()
    used = block_expert < e
    assert used.sum() == sum(-(-int((flat == j).sum()) // block) for j in range(e))
    assert torch.all(used[: int(used.sum())]) and not torch.any(used[int(used.sum()) :])  # used first
    assert torch.all(block_expert[used].diff() >= 0)  # expert order
    for b in range(int(used.sum())):
        rows = sorted_ids[b * block : (b + 1) * block]
        rows = rows[rows < n].long()
        assert torch.all(flat[rows] == block_expert[b]) and torch.all(rows.diff() > 0)
        if rows.numel() < block:  # only an expert's last block is padded
            assert b + 1 == block_expert.numel() or block_expert[b + 1] != block_expert[b]


class _Expert(nn.Module):
    def __init__(self, d, i):
        super().__init__()
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Moe(StackedExperts):
    expert_in_names, expert_out_name = ("gate_proj", "up_proj"), "down_proj"
    expert_act, expert_gated = "silu", True

    def __init__(self, e=4, d=16, i=8):
        super().__init__()
        self.experts = nn.ModuleList(_Expert(d, i) for _ in range(e))


def test_expert_stacks_are_views_of_the_checkpoint_parameters_after_every_move():
    torch.manual_seed(4)
    m = _Moe()
    names = [n for n, _ in m.named_parameters()]
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    m = m.to(torch.float64)
    assert [n for n, _ in m.named_parameters()] == names
    ex = m.routed_experts()
    assert ex.w_in.shape == (4, 16, 16) and ex.w_out.shape == (4, 16, 8) and ex.w_in.dtype == torch.float64
    for e, expert in enumerate(m.experts):
        assert torch.equal(expert.gate_proj.weight, before[f"experts.{e}.gate_proj.weight"].double())
        assert expert.up_proj.weight.data_ptr() == ex.w_in[e, 8:].data_ptr()
        assert expert.down_proj.weight.data_ptr() == ex.w_out[e].data_ptr()
    with torch.no_grad():  # an in-place load (the loader's copy_) lands in the stacks
        m.experts[2].up_proj.weight.copy_(torch.ones(8, 16))
    assert torch.equal(m.routed_experts().w_in[2, 8:], torch.ones(8, 16, dtype=torch.float64))
    m.experts[0].gate_proj.weight = nn.Parameter(torch.zeros(8, 16, dtype=torch.float64))  # replaced
    ex = m.routed_experts()
    assert torch.equal(ex.w_in[0, :8], torch.zeros(8, 16, dtype=torch.float64))
    assert m.experts[0].gate_proj.weight.data_ptr() == ex.w_in.data_ptr()


def test_moe_block_on_stacks_matches_its_modules():
    torch.manual_seed(5)
    m = _Moe().float()
    x = torch.randn(6, 16)
    weights, ids = softmax_topk(torch.randn(6, 4), 2, renormalize=True)
    ex = m.routed_experts()
    via_modules = moe_experts(x, weights, ids, ex)
    via_stacks = moe_experts(x, weights, ids, Experts(ex.w_in, ex.w_out, "silu", True))
    torch.testing.assert_close(via_modules, via_stacks)
