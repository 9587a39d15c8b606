"""Exactness of the engine on the GPU (issue 7): the GPU engine against the CPU oracle, and greedy tokens
of a cold run against a prefix hit at an arbitrary depth and a restore from a state exported inside a
chunk. Run by model_bench.py; the results land in its JSON."""

from __future__ import annotations

from pathlib import Path

import torch
from engine_setup import GREEDY, make_llm, prompt

from flashstate import LLM, SamplingParams
from flashstate.engine.output.request_output import RequestOutput


def check_oracle(model_dir: Path, out: dict) -> None:
    """GPU engine (bf16, GPU kernels) vs the CPU oracle (fp32, reference ops) on a short prompt."""
    ids = prompt(300, 1)
    logits = {}
    for device, dtype in (("cpu", "float32"), ("cuda", "bfloat16")):
        llm = LLM(
            str(model_dir),
            device=device,
            dtype=dtype,
            enable_prefix_caching=False,
            enforce_eager=True,
            kv_cache_memory_bytes=1 << 30,
            max_num_seqs=4,
        )
        seen = []
        llm.engine.runner.on_logits = lambda ids_, lg, seen=seen: seen.append(lg.float().cpu())
        res = llm.generate([ids], SamplingParams(max_tokens=8, **GREEDY))[0]
        logits[device] = (torch.cat(seen), res.token_ids)
        del llm
        torch.cuda.empty_cache()
    (lc, tc), (lg, tg) = logits["cpu"], logits["cuda"]
    first = (lg[0] - lc[0]).norm() / lc[0].norm()
    out["oracle"] = {
        "first_logits_rel_err": float(first),
        "greedy_tokens_cpu": tc,
        "greedy_tokens_gpu": tg,
        "first_token_equal": tc[0] == tg[0],
    }


def _divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; None when equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _greedy_paths(model_dir: Path, dtype: str) -> dict:
    llm = make_llm(
        model_dir, dtype=dtype, max_num_batched_tokens=8192, max_model_len=8192, kv_cache_memory_bytes=8 << 30
    )
    engine = llm.engine
    first_logits: dict[str, torch.Tensor] = {}

    def run(ids: list[int], max_tokens: int = 24, positions: list[int] | None = None) -> RequestOutput:
        rid = engine.add_request(
            ids, SamplingParams(max_tokens=max_tokens, **GREEDY), checkpoint_positions=positions
        )
        seen: list[torch.Tensor] = []

        def hook(ids_: list[str], logits: torch.Tensor) -> None:
            if rid in ids_:
                seen.append(logits[ids_.index(rid)].float().cpu())

        engine.runner.on_logits = hook
        final = None
        while engine.has_unfinished():
            for o in engine.step():
                if o.request_id == rid and o.finished:
                    final = o
        engine.runner.on_logits = None
        first_logits[rid] = seen[0]
        return final

    def compare(x: RequestOutput, y: RequestOutput) -> dict:
        lx, ly = first_logits[x.request_id], first_logits[y.request_id]
        return {
            "equal": x.token_ids == y.token_ids,
            "first_divergence": _divergence(x.token_ids, y.token_ids),
            "first_logits_rel_diff": float((lx - ly).norm() / ly.norm()),
        }

    a = prompt(1237, 2)
    first = run(a, 5)
    follow = a + first.token_ids + prompt(301, 3)
    hit = run(follow)
    engine.reset_prefix_cache()
    cold = run(follow)
    engine.reset_prefix_cache()
    long = prompt(5000, 4)
    run(long, 1, positions=[3333])
    branch = long[:3333] + prompt(257, 5)
    exported = run(branch)
    engine.reset_prefix_cache()
    branch_cold = run(branch)
    return {
        "hit_depth": hit.num_cached_tokens,
        "hit_vs_cold": compare(hit, cold),
        "export_depth": exported.num_cached_tokens,
        "export_vs_cold": compare(exported, branch_cold),
    }


def check_greedy_paths(model_dir: Path, out: dict) -> None:
    """Cold run vs prefix hit at an arbitrary depth vs restore from a state exported inside a chunk, for
    bf16 weights and for fp32 weights (states are fp32 in both). For each pair: equal greedy tokens, else
    the first differing step; and the relative difference of the first step's logits."""
    out["greedy_paths"] = {}
    for label, dtype in (("bf16", "bfloat16"), ("fp32", "float32")):
        out["greedy_paths"][label] = _greedy_paths(model_dir, dtype)
        torch.cuda.empty_cache()
