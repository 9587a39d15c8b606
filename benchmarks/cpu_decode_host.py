"""Host cost of one decode step on the CPU: engine.step() with the model forward replaced by a stub (issue 7).

    PYTHONPATH=. .venv/bin/python benchmarks/cpu_decode_host.py [--batches 1,16,64] [--context 32768]

`b` greedy requests share one `context`-token prompt prefix (one prefix-cache hit each, as in
benchmarks/gpu/model_bench.py's decode section), then decode `--steps` steps. The stub returns zero hidden
states and one of 64 fixed logit rows (picked by position), so every step samples real, varied tokens and
runs the engine's whole host path — scheduling, building the decode inputs, sampling, reading the sampled
tokens, stop checks, outputs — with no model time. What is printed is host milliseconds per step, split as
model_bench splits it (schedule, runner, postprocess, the rest of step()), less the stub's logits and the
sampler (device work on a GPU, timed and left out), plus the consumer reading every
output's delta_text (what a streaming server does; the engine may leave detokenisation to it).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from flashstate import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
from engine_setup import timed  # noqa: E402


class StubModel(torch.nn.Module):
    """Stands in for the model: zero hidden states, logits from a fixed table indexed by position."""

    def __init__(self, model: torch.nn.Module, vocab: int, rows: int = 64):
        super().__init__()
        self.spec = model.spec
        self.hidden_size = model.spec.hidden_size
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(rows, vocab, generator=g)
        self.rows = rows
        self._positions = torch.zeros(0, dtype=torch.long)

    def forward(self, input_ids, meta):
        self._positions = meta.positions
        return torch.zeros(input_ids.shape[0], self.hidden_size)

    def compute_logits(self, hidden):
        n = hidden.shape[0]
        pos = self._positions[-n:] if self._positions.numel() >= n else torch.zeros(n, dtype=torch.long)
        return self.table[pos % self.rows]


def bench(batches: list[int], context: int, steps: int, engine_kw: dict) -> list[dict]:
    llm = LLM(
        max_model_len=context + steps + 64,
        max_num_seqs=max(batches),
        max_num_batched_tokens=8192,
        kv_cache_memory_bytes=2 << 30,
        prefill_cost_coefficients=(1e-6, 1e-12),
        **engine_kw,
    )
    engine = llm.engine
    engine.runner.model = StubModel(engine.model, engine.spec.vocab_size)
    totals: dict[str, float] = defaultdict(float)
    timed(engine.scheduler, "schedule", totals, "schedule")
    for name in ("run", "launch", "launch_ahead", "collect"):  # the last three: async scheduling
        if hasattr(engine.runner, name):
            timed(engine.runner, name, totals, "runner")
    timed(engine, "_postprocess", totals, "postprocess")
    timed(engine.runner.sampler, "forward", totals, "compute")  # device work on the GPU, not host work
    timed(engine.runner.model, "compute_logits", totals, "compute")
    g = torch.Generator().manual_seed(1)
    base = torch.randint(100, 2000, (context - 1,), generator=g).tolist()
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=1)
    llm.generate([base], params)
    rows = []
    for b in batches:
        params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=steps + 8)
        for i in range(b):
            engine.add_request(base + [i], params)
        while any(s.is_prefilling for s in engine.scheduler.running) or engine.scheduler.waiting:
            engine.step()
        totals.clear()
        consume = 0.0
        start = time.perf_counter()
        for _ in range(steps):
            outs = engine.step()
            t = time.perf_counter()
            for o in outs:
                o.delta_text  # noqa: B018 — what a streaming consumer reads
            consume += time.perf_counter() - t
        step = (time.perf_counter() - start - consume) / steps
        keys = ("schedule", "runner", "postprocess", "compute")
        parts = {k: totals.get(k, 0.0) / steps * 1e3 for k in keys}
        parts["runner"] -= parts["compute"]
        parts["other"] = step * 1e3 - sum(parts.values())
        host = step * 1e3 - parts["compute"]
        rows.append({"batch": b, "host_ms": host, "consume_ms": consume / steps * 1e3, **parts})
        for seq in list(engine.scheduler.running):
            engine.abort(seq.request_id)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--engine", nargs="*", default=[], help="extra EngineConfig fields as key=value (ints)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    kw = {k: (v == "true") if v in ("true", "false") else int(v) for k, v in (x.split("=") for x in a.engine)}
    print(f"engine options: {kw or 'defaults'}")
    rows = bench([int(x) for x in a.batches.split(",")], a.context, a.steps, kw)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), context {a.context}")
    print(
        "| b | engine.step host ms | schedule | runner | postprocess | other | "
        "stub logits + sampler (device work, excluded) | consumer reads delta_text |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['host_ms']:.2f} | {r['schedule']:.2f} | {r['runner']:.2f} | "
            f"{r['postprocess']:.2f} | {r['other']:.2f} | {r['compute']:.2f} | {r['consume_ms']:.2f} |"
        )


if __name__ == "__main__":
    main()
