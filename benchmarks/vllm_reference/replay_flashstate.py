"""Replay the reference workload through flashstate's `--cache-policy vllm` and compare per-request cached
tokens with real vLLM's (results/vllm_*.json).

    .venv/bin/python benchmarks/vllm_reference/replay_flashstate.py --model /tmp/vllm-ref-ckpt \
        --vllm benchmarks/vllm_reference/results/vllm_ample.json [--pages N]

Prompts are built exactly as replay_vllm.py builds them, from this engine's own outputs. `--pages N`
gives the engine the bytes of vLLM's N-page pool (N × 73,728 B: N − 1 usable pages plus vLLM's null
page); without it, ample (256 MiB, as replay_vllm.py). Besides cached tokens, each request's view of
the emulated vLLM pool (which blocks and states along the prompt it holds before and after the request)
is compared with vLLM's trace (`cached_before` / `cached_after`).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from workload import PromptBuilder, load_spec  # noqa: E402

from flashstate import LLM, SamplingParams  # noqa: E402

PAGE = 73_728


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--workload", default=str(Path(__file__).parent / "workload.json"))
    p.add_argument("--vllm", required=True, help="a results/vllm_*.json of the same workload")
    p.add_argument("--pages", type=int, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    spec = load_spec(a.workload)
    ref = {r["id"]: r for r in json.loads(Path(a.vllm).read_text())["requests"]}
    budget = a.pages * PAGE if a.pages else 256 << 20
    llm = LLM(
        a.model,
        cache_policy="vllm",
        block_size=288,
        mamba_block_size=288,
        max_num_seqs=1,
        kv_cache_memory_bytes=budget,
        max_model_len=6144,
        max_num_batched_tokens=4096,  # vLLM's default, which cuts its prefill chunks
    )
    pages = llm.engine.cache.pages
    builder = PromptBuilder(spec)
    rows, agree, traces = [], 0, 0
    for req in spec["requests"]:
        prompt = builder.build(req)
        before = pages.path_map(prompt)
        out = llm.generate(
            prompt, SamplingParams(temperature=0, max_tokens=req["max_tokens"], ignore_eos=True)
        )[0]
        builder.record(req["id"], prompt, out.token_ids)
        after = pages.path_map(prompt + out.token_ids)
        theirs = int(ref[req["id"]]["num_cached_tokens"])
        agree += out.num_cached_tokens == theirs
        trace = before == _field(ref[req["id"]], "cached_before") and after == _field(
            ref[req["id"]], "cached_after"
        )
        traces += trace
        rows.append(
            {
                "id": req["id"],
                "prompt_len": len(prompt),
                "flashstate": out.num_cached_tokens,
                "vllm": theirs,
                "trace_agrees": trace,
            }
        )
    llm.engine.check_integrity()
    print("| id | prompt | vllm | flashstate(vllm policy) |\n|---|---|---|---|")
    for r in rows:
        mark = "" if r["flashstate"] == r["vllm"] else " ✗"
        print(f"| {r['id']} | {r['prompt_len']} | {r['vllm']} | {r['flashstate']}{mark} |")
    total = sum(r["prompt_len"] for r in rows)
    hit = {k: sum(r[k] for r in rows) / total for k in ("vllm", "flashstate")}
    print(
        f"\nagree on {agree}/{len(rows)} requests (pool traces on {traces}/{len(rows)}); "
        f"token hit rate vllm {hit['vllm']:.1%}, "
        f"flashstate(vllm policy) {hit['flashstate']:.1%}; plan: {llm.engine.plan.describe()}"
    )
    if a.out:
        Path(a.out).write_text(
            json.dumps({"pages": a.pages, "agree": agree, "trace_agree": traces, "rows": rows}, indent=1)
        )


def _field(row: dict, name: str):
    value = row[name]
    return ast.literal_eval(value) if isinstance(value, str) else value


if __name__ == "__main__":
    main()
