"""A real-size preset (`--load-format dummy`) on the card: prefill at 8k / 32k against the peak for the
*active* parameters' FLOPs, and decode steps at batch 1 / 16 / 48 against the memory floor (issue 30).
One engine per process (start-up timed to ready, as a server before /health), every timing through
engine.step().

    source benchmarks/gpu/device_env.sh
    python benchmarks/gpu/real_size_perf.py qwen3.6-35b-a3b [--quantization fp8] [--kv-cache-dtype fp8]

Definitions:
  prefill FLOPs  2 · (active linear parameters, embeddings and lm head excluded) · T + the lm head for the
                 last token + per attention layer 2 · H · (Dqk + Dv) · T²/2 (causal); the recurrent
                 mixers' own FLOPs are not counted. Active: each MoE layer's top-k routed experts.
                 Peak: 787 TFLOP/s bf16 (the H200's dense figure), twice that when the expert and dense
                 weights are FP8.
  decode floor   bytes a step must read, at the measured copy rate (read + write bytes per second):
                 every non-expert weight once (the embedding table one row per sequence unless tied),
                 each MoE layer's expected distinct experts E · (1 − (1 − k/E)^B) for B sequences under
                 uniform routing (random weights route close to uniformly), each sequence's KV at its
                 context, its recurrent states read and written.
Writes $OUT/real_size_perf_<preset>.json; prints one table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, os.getcwd())

from smoke import ceilings  # noqa: E402

from flashstate import LLM, SamplingParams  # noqa: E402
from flashstate.cache.cache_tensors import kv_bytes_per_block, state_bytes_per_slot  # noqa: E402
from flashstate.layers.stacked_experts import StackedExperts  # noqa: E402
from flashstate.models.param_count import count_active_parameters  # noqa: E402

BF16_PEAK = 787e12
GREEDY = dict(temperature=0.0, ignore_eos=True)
DECODE_CONTEXT = 4096


def prompt(n: int, seed: int, vocab: int = 30000) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, min(vocab, 30000), (n,), generator=g).tolist()


def sync() -> None:
    torch.cuda.synchronize()


def expert_layout(model: torch.nn.Module) -> tuple[int, list[tuple[int, int]]]:
    """(bytes of every parameter outside the routed experts, [(experts, bytes per expert)] per MoE layer)."""
    layers, expert_ids = [], set()
    for m in model.modules():
        if isinstance(m, StackedExperts):
            routed = m.routed_experts()
            scales = [getattr(routed, "w_in_scale", None), getattr(routed, "w_out_scale", None)]
            parts = [routed.w_in, routed.w_out, *scales]
            per = sum(t[0].numel() * t.element_size() for t in parts if t is not None)
            layers.append((routed.num_experts, per))
            for p in m.experts.parameters():
                expert_ids.add(id(p))
            for t in parts:
                if t is not None:
                    expert_ids.add(id(t))
    rest = 0
    tied = model.spec.tie_word_embeddings
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if id(p) in expert_ids:
                continue
            if isinstance(module, torch.nn.Embedding) and not tied:
                continue  # counted per sequence
            rest += p.numel() * p.element_size()
    return rest, layers


def prefill_flops(llm: LLM, tokens: int) -> float:
    spec = llm.engine.spec
    a = spec.attention
    active = count_active_parameters(spec, embeddings=False)
    flops = 2.0 * active * tokens + 2.0 * spec.hidden_size * spec.vocab_size
    if a is not None and spec.attention_layer_ids:
        dqk = a.head_dim if a.kv_lora_rank is None else a.qk_nope_head_dim + a.qk_rope_head_dim
        flops += len(spec.attention_layer_ids) * 2.0 * a.num_heads * (dqk + a.v_head_dim) * tokens**2 / 2
    return flops


def bench_prefill(llm: LLM, n: int, peak: float) -> dict:
    engine = llm.engine
    params = SamplingParams(max_tokens=1, **GREEDY)
    seconds = []
    for rep in range(3):  # the first compiles this length's kernels' variants
        engine.add_request(prompt(n, 100 + rep, engine.spec.vocab_size), params)
        sync()
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        sync()
        seconds.append(time.perf_counter() - start)
    s = min(seconds[1:])
    flops = prefill_flops(llm, n)
    return {"tokens": n, "seconds": s, "tokens_per_s": n / s, "tflops": flops / s / 1e12,
            "fraction_of_peak": flops / s / peak, "all_seconds": seconds}  # fmt: skip


def bench_decode(llm: LLM, b: int, copy_rate: float) -> dict:
    engine = llm.engine
    steps = 32
    base = prompt(DECODE_CONTEXT - 1, 7, engine.spec.vocab_size)
    for i in range(b):
        engine.add_request(base + [i + 1], SamplingParams(max_tokens=steps + 12, **GREEDY))
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or (
        engine.scheduler.waiting
    ):
        engine.step()
    for _ in range(4):
        engine.step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    step = (time.perf_counter() - start) / steps
    for seq in list(engine.scheduler.running):
        engine.abort(seq.request_id)
    while engine.has_unfinished():
        engine.step()
    spec, model = engine.spec, engine.model
    rest, layers = expert_layout(model)
    experts = sum(e * (1 - (1 - spec.moe.top_k / e) ** b) * per for e, per in layers) if layers else 0.0
    embed = 0 if spec.tie_word_embeddings else b * spec.hidden_size * engine.dtype.itemsize
    kv_dtype = getattr(engine.runner.caches, "kv_dtype", engine.dtype)
    kv = kv_bytes_per_block(spec, 1, kv_dtype) * (DECODE_CONTEXT + 20) * b
    states = 2 * state_bytes_per_slot(spec, engine.dtype) * b
    floor = (rest + experts + embed + kv + states) / copy_rate
    return {"batch": b, "context": DECODE_CONTEXT, "step_s": step, "floor_s": floor,
            "step_over_floor": step / floor, "bytes": {"weights": rest, "experts": experts, "kv": kv,
            "states": states}}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("preset")
    p.add_argument("--quantization", default=None)
    p.add_argument("--kv-cache-dtype", default=None)
    p.add_argument("--prefill", default="8192,32768")
    p.add_argument("--batches", default="1,16,48")
    a = p.parse_args()
    out: dict = {"preset": a.preset, "quantization": a.quantization, "kv_cache_dtype": a.kv_cache_dtype,
                 "torch": torch.__version__, "device": torch.cuda.get_device_name()}  # fmt: skip
    out.update(ceilings())
    torch.cuda.empty_cache()
    extra = {k: v for k, v in (("quantization", a.quantization), ("kv_cache_dtype", a.kv_cache_dtype)) if v}
    sync()
    t0 = time.perf_counter()
    llm = LLM(a.preset, load_format="dummy", max_model_len=32768 + 512, max_num_batched_tokens=32768,
              max_num_seqs=48, prefill_cost_coefficients=(1e-5, 1e-10), **extra)  # fmt: skip
    sync()
    out["start_s"] = time.perf_counter() - t0
    out["decode_graphs"] = list(getattr(llm.engine.runner.graphs, "sizes", []) or [])
    out["gpu_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    fp8 = any(p.dtype == torch.float8_e4m3fn for p in llm.engine.model.parameters())
    peak = BF16_PEAK * (2 if fp8 else 1)
    out["fp8_weights"] = fp8
    path = Path(os.environ.get("OUT", ".")) / f"real_size_perf_{a.preset}{'_fp8' if fp8 else ''}.json"
    out["prefill"] = []
    for n in (int(x) for x in a.prefill.split(",")):
        out["prefill"].append(bench_prefill(llm, n, peak))
        path.write_text(json.dumps(out, indent=1))
        print(json.dumps(out["prefill"][-1]), flush=True)
    out["decode"] = []
    for b in (int(x) for x in a.batches.split(",")):
        out["decode"].append(bench_decode(llm, b, out["copy_gb_per_s"] * 1e9))
        path.write_text(json.dumps(out, indent=1))
        print(json.dumps(out["decode"][-1]), flush=True)
    print(f"\n{a.preset} fp8={fp8}: start {out['start_s']:.0f} s, peak {out['gpu_mem_gib']:.1f} GiB, "
          f"graphs {out['decode_graphs'][:1]}..{out['decode_graphs'][-1:]}; "
          f"matmul {out['bf16_matmul_tflops']:.0f} TFLOP/s, copy {out['copy_gb_per_s']:.0f} GB/s")
    for r in out["prefill"]:
        print(f"prefill {r['tokens']:>6}: {r['tokens_per_s']:>8.0f} tok/s {r['tflops']:6.1f} TFLOP/s "
              f"{r['fraction_of_peak']:.1%} of active-FLOP peak")  # fmt: skip
    for r in out["decode"]:
        ms, floor = r["step_s"] * 1e3, r["floor_s"] * 1e3
        print(f"decode b={r['batch']:>2}: {ms:6.2f} ms/step, floor {floor:5.2f} ms, x{ms / floor:.2f}")


if __name__ == "__main__":
    main()
