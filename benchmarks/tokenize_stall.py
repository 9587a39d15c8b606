"""What a server's tokenizing does to the engine's steps: the engine steps a decode load (the tiny model with
a stub forward: the host's work alone, or `--preset` on `--device`) while another thread tokenizes long text
prompts at `--prompts-per-s`, as `flashstate serve` does for each request (`asyncio.to_thread(
tokenizer.encode, …)`).

    PYTHONPATH=. .venv/bin/python benchmarks/tokenize_stall.py [--prompt-chars 100000] [--streams 16]

Three runs: no tokenizing thread; the tokenizer's single-text call (`tokenizers.Tokenizer.encode`, which
holds the GIL while it encodes); `flashstate.tokenizer.Tokenizer.encode` (the batch call, which releases it).
Per run: decode steps, their mean / p99 / worst time, and the prompts tokenized meanwhile. One table.
The engine gets `--torch-threads` CPU threads (default 1) and the tokenizer one: on a 2-core machine that
keeps them on separate cores, so what remains is the GIL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from flashstate import SamplingParams
from flashstate.bench.step_summary import read_trace
from flashstate.engine.llm_engine import LLMEngine

sys.path.insert(0, str(Path(__file__).parent))
from server_stream import make_config, new_trace, stubbed  # noqa: E402


def run(args: argparse.Namespace, mode: str, text: str) -> dict:
    trace = new_trace()
    engine = stubbed(LLMEngine(make_config(args, trace)), args)
    tok = engine.tokenizer
    encode = {"held": lambda: tok.backend.encode(text), "released": lambda: tok.encode(text)}.get(mode)
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=args.tokens)
    for i in range(args.streams):
        engine.add_request([100 + (7 * i + j) % 1500 for j in range(args.prompt_tokens)], params)
    stop, encoded = threading.Event(), [0]

    def tokenize() -> None:  # a prompt every 1 / rate seconds, as requests arrive
        next_at = time.perf_counter()
        while not stop.wait(max(0.0, next_at - time.perf_counter())):
            encode()
            encoded[0] += 1
            next_at += 1 / args.prompts_per_s

    worker = threading.Thread(target=tokenize, daemon=True) if encode else None
    start = time.perf_counter()
    if worker:
        worker.start()
    while engine.has_unfinished():
        engine.step()
    wall = time.perf_counter() - start
    stop.set()
    if worker:
        worker.join()
    engine.close()
    rows = read_trace(Path(trace))[0]
    ms = np.array([r["ms"] for r in rows if not r["prefill_tokens"] and r["decode_seqs"]])
    return {"wall_s": wall, "decode_steps": len(ms), "mean_ms": float(ms.mean()),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
            "prompts_tokenized": encoded[0]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--prompt-chars", type=int, default=100_000, help="the size of each tokenized text prompt")
    p.add_argument(
        "--prompts-per-s", type=float, default=8.0, help="the headline's servers see ~8-9 a second"
    )
    p.add_argument("--preset", help="a model preset (default: the tiny model with a stub forward)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--cache-bytes", type=int, default=1 << 30, help="KV + state budget")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="the engine's CPU threads: 1 leaves the tokenizer a core of its own on a small "
                   "machine, as a GPU server has")  # fmt: skip
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    torch.set_num_threads(args.torch_threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core for the tokenizer as well
    unit = "def handler(event, context):\n    return json.dumps({'status': 200, 'body': event})  # ok\n"
    text = (unit * (args.prompt_chars // len(unit) + 1))[: args.prompt_chars]
    run(argparse.Namespace(**{**vars(args), "streams": 2, "tokens": 8}), "none", text)  # warm-up
    rows = {mode: run(args, mode, text) for mode in ("none", "held", "released")}
    print(f"\n{args.preset or 'stub'} on {args.device}: {args.streams} streams × {args.tokens} tokens; "
          f"a thread tokenizes {args.prompts_per_s:g} prompts of {args.prompt_chars:,} characters "
          "a second")  # fmt: skip
    print("| tokenizing thread | decode steps | mean ms | p99 ms | worst ms | prompts tokenized |")
    print("|---|---|---|---|---|---|")
    names = {
        "none": "none",
        "held": "`tokenizers` encode (holds the GIL)",
        "released": "`Tokenizer.encode` (releases it)",
    }
    for mode, r in rows.items():
        print(f"| {names[mode]} | {r['decode_steps']} | {r['mean_ms']:.2f} | {r['p99_ms']:.2f} "
              f"| {r['max_ms']:.2f} | {r['prompts_tokenized']} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
