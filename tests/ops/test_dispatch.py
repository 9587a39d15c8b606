import subprocess
import sys

import torch
import torch.nn.functional as F

from flashstate.ops import attention, gated_delta_rule, kda, short_conv, ssd
from flashstate.ops.attention import naive as attn_naive
from flashstate.ops.backend import backend
from flashstate.ops.gated_delta_rule import naive as gdn_naive


def test_cpu_tensors_route_to_the_oracles_without_importing_gpu_kernels():
    for package, gpu in [
        ("gated_delta_rule", "fla"),
        ("kda", "fla"),
        ("ssd", "fla"),
        ("short_conv", "triton"),
        ("attention", "triton"),
    ]:
        assert backend(package, gpu, torch.zeros(1)).__name__ == f"flashstate.ops.{package}.naive"
    # A fresh process that runs an op on CPU tensors never imports the GPU kernels (nor triton / fla).
    code = (
        "import sys, torch\n"
        "from flashstate.ops import attention\n"
        "kc = torch.zeros(1, 4, 1, 8)\n"
        "attention.paged_attention(torch.randn(2, 1, 8), kc, kc, cu_seqlens=torch.tensor([0, 2]),\n"
        "    context_lens=torch.tensor([2]), block_tables=torch.tensor([[0]]), scale=1.0)\n"
        "gpu = lambda m: m.split('.')[0] in ('triton', 'fla') or m.startswith('flashstate.ops.') and "
        "m.endswith(('.triton', '.fla'))\n"
        "print(sorted(filter(gpu, sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _pool_args(pool, lens, fresh):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    return dict(
        state_pool=pool,
        state_indices=torch.arange(len(lens)),
        has_initial_state=~torch.tensor(fresh),
        cu_seqlens=cu,
    )


def test_dispatchers_compute_the_oracles_results_on_cpu():
    torch.manual_seed(0)
    t, h, d = 70, 2, 8
    q, k, v = (torch.randn(1, t, h, d) for _ in range(3))
    g, beta = F.logsigmoid(torch.randn(1, t, h)), torch.rand(1, t, h)
    pool = torch.randn(2, h, d, d)
    p1, p2 = pool.clone(), pool.clone()
    exports = torch.tensor([3, 64, 69])
    o1, e1 = gated_delta_rule.chunk_gated_delta_rule(
        q, k, v, g, beta, **_pool_args(p1, [40, 30], [False, True]), export_token_ids=exports
    )
    o2, e2 = gdn_naive.chunk_gated_delta_rule(
        q, k, v, g, beta, **_pool_args(p2, [40, 30], [False, True]), export_token_ids=exports
    )
    assert torch.equal(o1, o2) and torch.equal(e1, e2) and torch.equal(p1, p2)

    gk = F.logsigmoid(torch.randn(1, t, h, d))
    o, e = kda.fused_recurrent_kda(
        q, k, v, gk, beta, **_pool_args(pool.clone(), [70], [True]), export_token_ids=exports
    )
    assert o.shape == (1, t, h, d) and e.shape == (3, h, d, d)

    x, dt = torch.randn(1, t, 4, d), torch.randn(1, t, 4)
    b, c = torch.randn(1, t, 1, 16), torch.randn(1, t, 1, 16)
    y, e = ssd.chunk_ssd(
        x,
        dt,
        -torch.rand(4),
        b,
        c,
        **_pool_args(torch.zeros(1, 4, d, 16), [t], [True]),
        export_token_ids=exports,
    )
    assert y.shape == x.shape and e.shape == (3, 4, d, 16)

    y, e = short_conv.causal_conv1d(
        torch.randn(t, 6),
        torch.randn(6, 4),
        None,
        conv_state_pool=torch.zeros(1, 6, 3),
        state_indices=torch.tensor([0]),
        has_initial_state=torch.tensor([False]),
        cu_seqlens=torch.tensor([0, t]),
    )
    assert y.shape == (t, 6) and e.shape == (0, 6, 3)


def test_attention_dispatch_matches_the_oracle_on_cpu():
    torch.manual_seed(0)
    kc, vc = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    k, v, q = torch.randn(10, 2, 8), torch.randn(10, 2, 8), torch.randn(10, 4, 8)
    slots = torch.tensor([4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
    attention.store_kv(k, v, kc, vc, slots)
    args = dict(
        cu_seqlens=torch.tensor([0, 10]),
        context_lens=torch.tensor([14]),
        block_tables=torch.tensor([[0, 1, 2, 3]]),
        scale=0.3,
    )
    assert torch.equal(
        attention.paged_attention(q, kc, vc, **args), attn_naive.paged_attention(q, kc, vc, **args)
    )
