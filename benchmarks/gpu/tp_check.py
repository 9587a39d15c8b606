"""Tensor parallelism on one host: TP=N greedy tokens equal TP=1, then prefill and decode throughput.

    PYTHONPATH=. python benchmarks/gpu/tp_check.py                       # ≥ 2 GPUs; writes $OUT/tp_check.json
    PYTHONPATH=. python benchmarks/gpu/tp_check.py --device cpu --small  # the same, small, on CPU (gloo)

1. Exactness: for the three tiny presets and a ~2B preset (in fp32, so that the different summation
   order is unlikely to flip a greedy near tie), two turns per agent (turn 2 resends turn 1 + its reply +
   new tokens and resumes from the frontier checkpoint, mid-block) plus a sub-agent forked at an arbitrary
   depth; the TP=N tokens must equal TP=1's.
2. Throughput on qwen3-next-2b in bf16, TP=1 vs TP=N (decode CUDA graphs on both; TP=N eager too):
   prefill of one 8k-token prompt (one chunk; tok/s of the time to first token) and decode of a batch of
   16 (generated tokens after the first, per second, between the last first token and the last finish).
   --small: tiny preset, 512 tokens, batch 4.
   `--only exactness|throughput` runs one part (each fits the device's 10-minute command limit better).
   `--ieee`: FLA's fp32 dots in IEEE precision instead of TF32, to tell a near tie flipped by TF32 rounding
   from a sharding error. `--reference-ops`: the same question without compiling anything, every op's
   plain-torch oracle on the GPU with TF32 off.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_setup import profiled_step  # noqa: E402

from flashstate import LLM, SamplingParams  # noqa: E402
from flashstate.distributed.worker import dump_stacks_when_stuck  # noqa: E402
from flashstate.models.presets import preset_dir  # noqa: E402
from flashstate.ops.backend import use_reference_ops  # noqa: E402

TINY = ["tiny", "tiny-nemotron-h", "tiny-kimi-linear"]


def _engine(preset: str, tp: int, device: str, **kw) -> LLM:
    return LLM(
        str(preset_dir(preset)),
        tensor_parallel_size=tp,
        device=device,
        prefill_cost_coefficients=(1e-5, 1e-10),
        **kw,
    )


def _close(llm: LLM) -> None:
    llm.close()
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _workload(llm: LLM, seed: int, turn_tokens: int) -> tuple[list[list[int]], list[list[float]], list[int]]:
    """Greedy tokens and their logprobs of every request, and the cached depth of every turn-2 request."""
    rng = random.Random(seed)
    vocab = llm.engine.spec.vocab_size
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    agents = [[rng.randrange(vocab) for _ in range(turn_tokens + rng.randrange(13))] for _ in range(3)]
    first = llm.generate(agents, params)
    fork = agents[0][: rng.randint(3, len(agents[0]))] + [rng.randrange(vocab) for _ in range(7)]
    second = [
        a + o.token_ids + [rng.randrange(vocab) for _ in range(5)] for a, o in zip(agents, first, strict=True)
    ]
    outs = llm.generate([*second, fork], params)
    every = first + outs
    return [o.token_ids for o in every], [o.logprobs for o in every], [o.num_cached_tokens for o in outs]


def check_exactness(
    presets: list[str], tp: int, device: str, turn_tokens: int, eager: bool = False
) -> list[dict]:
    rows = []
    for preset in presets:
        result = {}
        for n in (1, tp):
            kw = {"dtype": "float32", "block_size": 16, "max_num_batched_tokens": 64, "max_model_len": 4096}
            # 8 sequences at most: a ~2B preset's fp32 states are ~40 MB each
            llm = _engine(
                preset, n, device, kv_cache_memory_bytes=4 << 30, max_num_seqs=8, enforce_eager=eager, **kw
            )
            start = time.perf_counter()
            result[n] = (
                *_workload(llm, seed=len(preset), turn_tokens=turn_tokens),
                time.perf_counter() - start,
            )
            _close(llm)
            _progress(f"{preset} TP={n}", f"engine and workload in {time.perf_counter() - start:.0f} s")
        tokens_1, logprobs_1, cached_1, _ = result[1]
        tokens_n, logprobs_n, cached_n, _ = result[tp]
        first = [
            next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)
            for x, y in zip(tokens_1, tokens_n, strict=True)
        ]
        # A near tie flipped by the summation order shows as tiny logprob differences up to the first
        # differing step and two close logprobs there; a sharding bug as large ones.
        same = [
            abs(a - b)
            for x, y, f in zip(logprobs_1, logprobs_n, first, strict=True)
            for a, b in zip(x[:f], y[:f], strict=False)
        ]
        rows.append(
            {
                "preset": preset,
                "tokens_equal": tokens_1 == tokens_n,
                # per request: the first step whose token differs (None: equal)
                "first_difference": first,
                "max_logprob_difference_before": max(same, default=0.0),
                "logprobs_at_difference": [
                    None if f is None else (x[f], y[f])
                    for x, y, f in zip(logprobs_1, logprobs_n, first, strict=True)
                ],
                "cached_tp1": cached_1,
                f"cached_tp{tp}": cached_n,
                "mid_block_hit": any(c % 16 for c in cached_n),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _progress(label: str, what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {label}: {what}", file=sys.stderr, flush=True)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def throughput(
    preset: str, tp: int, eager: bool, device: str, prefill_len: int, batch: int, decode_len: int
) -> dict:
    label = f"TP={tp}{' enforce_eager' if eager else ''}"
    began = time.perf_counter()
    llm = _engine(
        preset,
        tp,
        device,
        enforce_eager=eager,
        enable_prefix_caching=False,
        max_num_batched_tokens=prefill_len,
        max_num_seqs=max(batch, 1),
        max_model_len=prefill_len + decode_len + 16,
        kv_cache_memory_bytes=(8 << 30) if device != "cpu" else (256 << 20),
    )
    graphs = llm.engine.runner.graphs is not None
    _progress(label, f"engine started in {time.perf_counter() - began:.0f} s (decode graphs: {graphs})")
    vocab = llm.engine.spec.vocab_size
    rng = random.Random(0)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    prefill = []
    for _ in range(4):  # the first is a warm-up
        prompt = [rng.randrange(vocab) for _ in range(prefill_len)]
        _sync()
        start = time.perf_counter()
        llm.generate([prompt], one)
        _sync()
        prefill.append(time.perf_counter() - start)
    _progress(label, f"prefill {prefill_len} tokens: {min(prefill[1:]) * 1e3:.1f} ms")
    params = SamplingParams(temperature=0, max_tokens=decode_len, ignore_eos=True)
    decode = []
    for _ in range(3):
        outs = llm.generate([[rng.randrange(vocab) for _ in range(128)] for _ in range(batch)], params)
        begin = max(o.stats.first_token_time for o in outs)
        end = max(o.stats.finished_time for o in outs)
        decode.append(batch * (decode_len - 1) / (end - begin))
        _progress(label, f"decode batch {batch}: {decode[-1]:,.0f} tok/s")
    if device != "cpu" and not eager:  # where rank 0's prefill step goes (NCCL waits show as all-reduce time)
        llm.engine.add_request([rng.randrange(vocab) for _ in range(prefill_len)], one)
        profiled_step(llm.engine, Path(os.environ.get("OUT", ".")) / f"profile_tp{tp}_prefill.txt")
        while llm.engine.has_unfinished():
            llm.engine.step()
    _close(llm)
    _progress(label, "closed")
    best_prefill = min(prefill[1:])
    return {
        "tp": tp,
        "decode_graphs": graphs,
        "prefill_tokens": prefill_len,
        "prefill_seconds": best_prefill,
        "prefill_tok_per_s": prefill_len / best_prefill,
        "decode_batch": batch,
        "decode_tokens_each": decode_len,
        "decode_tok_per_s": max(decode[1:]),
    }


def _save(out: dict, only: str | None) -> None:
    folder = os.environ.get("OUT", ".")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"tp_check{'_' + only if only else ''}.json"), "w") as f:
        json.dump(out, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--small", action="store_true", help="tiny sizes (CPU)")
    p.add_argument("--only", choices=("exactness", "throughput"), help="run one part (JSON per part)")
    p.add_argument("--presets", help="comma list for the exactness part (default: the three tiny + 2B)")
    p.add_argument(
        "--ieee",
        action="store_true",
        help="fp32 Triton dots in IEEE precision, not TF32 (TRITON_F32_DEFAULT=ieee; every rank inherits it)",
    )
    p.add_argument("--skip-eager", action="store_true", help="throughput: no TP=N enforce_eager run")
    p.add_argument(
        "--reference-ops",
        action="store_true",
        help="the exactness part with every op's plain-torch oracle on the GPU too, TF32 off, decode eager: "
        "no kernel compiles, and only the all-reduce's summation order differs between TP=1 and TP=N",
    )
    p.add_argument(
        "--stack-dump-s",
        type=float,
        default=0,
        help="every rank writes its Python stacks to stderr at this interval (finding a stuck collective)",
    )
    args = p.parse_args()
    if args.ieee:
        os.environ["TRITON_F32_DEFAULT"] = "ieee"  # read when a kernel compiles: before the first one
    if args.reference_ops:
        use_reference_ops()
        os.environ["NVIDIA_TF32_OVERRIDE"] = "0"  # cuBLAS / cuDNN in every rank (the workers inherit it)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    if args.device.startswith("cuda") and torch.cuda.device_count() < args.tp:
        sys.exit(f"tp_check: needs {args.tp} GPUs, {torch.cuda.device_count()} visible")
    presets = TINY if args.small else [*TINY, "qwen3-next-2b"]
    if args.presets:
        presets = args.presets.split(",")
    out: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"cpu ({os.cpu_count()} cores)",
        "tp": args.tp,
        "ieee": args.ieee,
        "reference_ops": args.reference_ops,
        "small": args.small,
    }
    if args.stack_dump_s:  # every rank (the workers inherit the variable) dumps its stacks when stuck
        os.environ["FLASHSTATE_STACK_DUMP_S"] = str(args.stack_dump_s)
        dump_stacks_when_stuck()
    if args.only != "throughput":
        turn_tokens = 40 if args.small else 300
        out["exactness"] = check_exactness(
            presets, args.tp, args.device, turn_tokens, eager=args.reference_ops
        )
        _save(out, args.only)
    bench = ("tiny", 512, 4, 16) if args.small else ("qwen3-next-2b", 8192, 16, 64)
    if args.only != "exactness":
        out["throughput_preset"] = bench[0]
        out["throughput"] = []
        # TP=N with graphs last: a run cut short (or stuck) keeps the rows before it
        runs = [(1, False), *([] if args.skip_eager else [(args.tp, True)]), (args.tp, False)]
        for n, eager in runs:
            out["throughput"].append(throughput(bench[0], n, eager, args.device, *bench[1:]))
            print(json.dumps(out["throughput"][-1]), flush=True)
            _save(out, args.only)
    print(f"\n{out['device']}, torch {out['torch']}, {bench[0]}")
    print("| check | result |\n|---|---|")
    for row in out.get("exactness", []):
        print(f"| TP={args.tp} tokens == TP=1, {row['preset']} | {row['tokens_equal']} |")
    if "throughput" not in out:
        return
    print(f"\n| TP | decode | prefill {bench[1]} tok (tok/s) | decode batch {bench[2]} (tok/s) |")
    print("|---|---|---|---|")
    for r in out["throughput"]:
        mode = "graphs" if r["decode_graphs"] else "eager"
        print(f"| {r['tp']} | {mode} | {r['prefill_tok_per_s']:,.0f} | {r['decode_tok_per_s']:,.0f} |")


if __name__ == "__main__":
    main()
