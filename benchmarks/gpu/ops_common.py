"""Helpers shared by the GPU op checks and timings (ops_check.py, ops_timing.py): the device, the result rows
and how they are recorded, relative errors, medians of `triton.testing.do_bench`, paged-attention inputs."""

from __future__ import annotations

import json

import torch
from triton.testing import do_bench

DEV = "cuda"
BF16 = torch.bfloat16
rows: list[dict] = []


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if not torch.isfinite(a).all():
        return float("nan")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def record(kind: str, name: str, **values) -> None:
    rows.append({"kind": kind, "name": name, **values})
    print(kind, name, json.dumps(values), flush=True)


def ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def paged_setup(q_lens, ctx, hq, hkv, d, dv, page=16, dtype=BF16, device=DEV):
    n = len(q_lens)
    nb = sum(-(-c // page) for c in ctx) + 4
    kc = torch.randn(nb, page, hkv, d, device=device, dtype=dtype)
    vc = torch.randn(nb, page, hkv, dv, device=device, dtype=dtype)
    perm = torch.randperm(nb, device=device)
    width = max(-(-c // page) for c in ctx)
    table = torch.zeros(n, width, dtype=torch.int32, device=device)
    j = 0
    for i, c in enumerate(ctx):
        k = -(-c // page)
        table[i, :k] = perm[j : j + k]
        j += k
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = torch.randn(int(cu[-1]), hq, d, device=device, dtype=dtype)
    return q, kc, vc, cu, torch.tensor(ctx, dtype=torch.int32, device=device), table
