"""Tabulate vLLM reference results and check them against a model of vLLM 0.32's "align" prefix cache.

Standard library only:

    python3 benchmarks/vllm_reference/summarize.py benchmarks/vllm_reference/results/vllm_*.json

The model (`predict`, unbounded cache, no eviction), with B the block size and a request's prompt of
length L:

  lookup   A = the longest run of cached full attention blocks matching the prompt, capped at
               floor((L-1)/B)*B (the last prompt token is always recomputed);
           hit = the deepest p <= A, p a multiple of B, with a recurrent-state checkpoint cached for
               exactly the prefix prompt[:p]  ->  RequestOutput.num_cached_tokens
  prefill  keeps state checkpoints at
               R = floor((L-1)/B)*B              (the "replay boundary", last block boundary before
                                                  the final prompt token), and
               J = A when A > hit                 (the "shared-prefix junction": where the prompt
                                                  leaves the longest cached attention path);
           states at prefill-chunk ends elsewhere are dropped (prefix_cache_retention_interval=0);
  decode   caches the KV of every full block of prompt + output[:-1] (generated tokens' KV is
           reusable), but keeps no recurrent state inside the output.

The older rule "a later turn hits floor(previous prompt / B)*B" is the special case of a continuation
whose previous prompt does not end exactly on a block boundary (R = floor((L-1)/B)*B).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import PromptBuilder, load_spec  # noqa: E402


def predict(spec: dict, B: int) -> dict[str, dict]:
    """Per request: the hit under the model above, plus the terms it came from."""
    builder = PromptBuilder(spec)
    attn: set[tuple] = set()  # prefixes (as tuples) whose last full block's KV is cached
    states: set[tuple] = set()  # prefixes with a cached recurrent state
    out: dict[str, dict] = {}
    fake = -1
    for req in spec["requests"]:
        prompt = builder.build(req)
        L = len(prompt)
        cap = (L - 1) // B * B
        a = 0  # attention hit
        while a + B <= cap and tuple(prompt[: a + B]) in attn:
            a += B
        hit = max((p for p in range(B, a + 1, B) if tuple(prompt[:p]) in states), default=0)
        r = cap  # replay boundary
        j = a if a > hit else 0  # shared-prefix junction
        for p in (r, j):
            if p > 0:
                states.add(tuple(prompt[:p]))
        gen = list(range(fake, fake - req["max_tokens"], -1))  # unique stand-in output tokens
        fake -= req["max_tokens"]
        seq = prompt + gen[:-1]
        for k in range(B, len(seq) + 1, B):
            attn.add(tuple(seq[:k]))
        builder.record(req["id"], prompt, gen)
        out[req["id"]] = {"L": L, "A": a, "hit": hit, "R": r, "J": j}
    return out


def prev_prompt_rule(spec: dict, B: int) -> dict[str, int | None]:
    """floor(previous prompt / B)*B for multi-turn continuations, None otherwise."""
    lens = spec["expected_prompt_len"]
    rule: dict[str, int | None] = {}
    for r in spec["requests"]:
        base = r["base"]
        if base and base.get("take") == "prompt+output":
            rule[r["id"]] = lens[base["request"]] // B * B
        else:
            rule[r["id"]] = None
    return rule


def main(paths: list[str]) -> None:
    results = [json.loads(Path(p).read_text()) for p in paths]
    here = Path(__file__).resolve().parent
    spec = load_spec(here / "workload.json")
    B = results[0]["block_size"]
    assert all(r["block_size"] == B for r in results), "results with different block sizes"
    model = predict(spec, B)
    old = prev_prompt_rule(spec, B)
    names = []
    for r in results:
        mem = r["args"]["kv_cache_memory_bytes"]
        blocks = r["vllm_config"]["frontend_cache_config"]["num_gpu_blocks"]
        names.append(f"{blocks}blk" if mem < 100 << 20 else "ample")
    head = (
        f"| {'id':6} | {'L':>5} | {'floor(prev/B)B':>14} | {'model':>5} | "
        + " | ".join(f"{n:>7}" for n in names)
        + " | note"
    )
    print(head)
    print("|" + "|".join("---" for _ in range(5 + len(names))) + "|---|")
    mism_model = mism_old = 0
    for i, req in enumerate(spec["requests"]):
        rid = req["id"]
        vals = [r["requests"][i]["num_cached_tokens"] for r in results]
        assert all(r["requests"][i]["id"] == rid for r in results)
        o = old[rid]
        amp = [v for v, n in zip(vals, names, strict=True) if n == "ample"]
        if amp and amp[0] != model[rid]["hit"]:
            mism_model += 1
        if amp and o is not None and amp[0] != o:
            mism_old += 1
        flag = "" if not amp or amp[0] == model[rid]["hit"] else " MODEL MISMATCH"
        print(
            f"| {rid:6} | {model[rid]['L']:5d} | {'' if o is None else o:>14} | {model[rid]['hit']:5d} | "
            + " | ".join(f"{v:7d}" for v in vals)
            + f" | {req['note']}{flag}"
        )
    print()
    tot = sum(m["L"] for m in model.values())
    for n, r in zip(names, results, strict=True):
        hits = sum(q["num_cached_tokens"] for q in r["requests"])
        print(f"{n:>7}: token hit rate {hits / tot:.1%} ({hits}/{tot} prompt tokens)")
    print(f"model mismatches vs ample: {mism_model}; floor(prev/B)*B mismatches on continuations: {mism_old}")


if __name__ == "__main__":
    main(sys.argv[1:])
