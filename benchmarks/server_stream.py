"""What serving costs per decode step: the same decode load stepped directly (main thread), through the
AsyncEngine's thread without HTTP (an asyncio consumer in the main thread), and through the real server
(FastAPI + uvicorn on loopback, clients streaming from a process of their own).

    PYTHONPATH=. .venv/bin/python benchmarks/server_stream.py [--streams 48] [--tokens 200]
    PYTHONPATH=. python3 benchmarks/server_stream.py --preset qwen3-next-2b --device cuda \
        --streams 32 --tokens 256 --prompt-tokens 16384          # the H200: the real model, greedy

`--streams` requests, all at once, each from a token-id prompt of `--prompt-tokens`; request i generates
(i + 1) / streams of `--tokens`, so the batch shrinks one sequence at a time. `--arrivals K` adds K short
requests (`--arrival-tokens` each, 2 output tokens), one every `--arrival-gap` seconds while the streams
decode: each prefills in a mixed step beside the decoding rows, and the modes' prefill steps are compared
too (what a served prefill step costs over the same step stepped directly). Without `--preset` the model
forward is a stub (the host's work alone); with one, the preset's model runs on `--device`. Each mode's
decode steps come from its step trace: their mean time, and the fit step = base + per_seq · B (what a
sequence adds to a decode step). Prints one table; `--out` writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import uvicorn

from flashstate import EngineConfig, SamplingParams
from flashstate.bench.step_summary import read_trace, summarize_rows
from flashstate.engine.async_engine import AsyncEngine
from flashstate.engine.llm_engine import LLMEngine
from flashstate.server.app import build_app

sys.path.insert(0, str(Path(__file__).parent))
from cpu_decode_host import StubModel  # noqa: E402

from flashstate.models.presets import preset_dir  # noqa: E402


def make_config(args: argparse.Namespace, trace: str) -> EngineConfig:
    return EngineConfig(
        model=str(preset_dir(args.preset)) if args.preset else None,
        device=args.device,
        max_model_len=args.prompt_tokens + args.tokens + 16,
        max_num_seqs=args.streams,
        max_num_batched_tokens=8192,
        kv_cache_memory_bytes=args.cache_bytes,
        prefill_cost_coefficients=(1e-6, 1e-12),
        enable_prefix_caching=False,
        step_trace=trace,
    )


def stubbed(engine: LLMEngine, args: argparse.Namespace) -> LLMEngine:
    """Without a preset the model forward is a stub: what remains is the host's work."""
    if not args.preset:
        engine.runner.model = StubModel(engine.model, engine.spec.vocab_size)
    return engine


def prompts(args: argparse.Namespace) -> list[list[int]]:
    return [[100 + (7 * i + j) % 1500 for j in range(args.prompt_tokens)] for i in range(args.streams)]


def arrivals(args: argparse.Namespace) -> list[tuple[float, list[int]]]:
    """(seconds after the start, prompt) of each short arrival."""
    tokens = range(args.arrival_tokens)
    return [
        (args.arrival_start + i * args.arrival_gap, [50 + (11 * i + 3 * j) % 1900 for j in tokens])
        for i in range(args.arrivals)
    ]


def lengths(args: argparse.Namespace) -> list[int]:
    """Request i generates (i + 1) / streams of `--tokens`: the batch shrinks from `--streams` to 1, so the
    decode steps span every batch size (and the batch changes as requests finish, as under serving)."""
    return [max(2, args.tokens * (i + 1) // args.streams) for i in range(args.streams)]


def params(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, ignore_eos=True, max_tokens=n)


def new_trace() -> str:
    return str(Path(tempfile.mkdtemp()) / "steps.jsonl")


def decode_steps(trace: str) -> dict:
    """The step summary's decode rows (bench/step_summary.py), the decode step's fit over batch size, and
    the arrivals' steps: those with prefill after the first decode step (mixed steps)."""
    rows = read_trace(Path(trace))[0]
    summary = summarize_rows(rows)
    decode = [r for r in rows if not r["prefill_tokens"] and r["decode_seqs"]]
    first = rows.index(decode[0]) if decode else len(rows)
    mixed = [r["ms"] for r in rows[first:] if r["prefill_tokens"]]
    ms = np.array([r["ms"] for r in decode])
    batch = np.array([r["decode_seqs"] for r in decode], dtype=float)
    fit = np.polyfit(batch, ms, 1) if np.ptp(batch) > 0 else (float("nan"), float("nan"))
    return {
        **{k: summary[k] for k in ("decode_steps", "decode_step_ms_mean", "decode_batch_mean")},
        "prefill_steps": len(mixed),
        "prefill_step_ms_mean": float(np.mean(mixed)) if mixed else None,
        "prefill_step_ms_median": float(np.median(mixed)) if mixed else None,
        "per_seq_ms": float(fit[0]),
        "base_ms": float(fit[1]),
    }


def direct(args: argparse.Namespace) -> dict:
    trace = new_trace()
    engine = stubbed(LLMEngine(make_config(args, trace)), args)
    for p, n in zip(prompts(args), lengths(args), strict=True):
        engine.add_request(p, params(n))
    due = arrivals(args)
    start = time.perf_counter()
    while engine.has_unfinished() or due:
        while due and time.perf_counter() - start >= due[0][0]:
            engine.add_request(due.pop(0)[1], params(2))
        for out in engine.step():
            out.delta_text  # noqa: B018 — what a streaming consumer reads
    wall = time.perf_counter() - start
    engine.close()
    return {"wall_s": wall, **decode_steps(trace)}


def threaded(args: argparse.Namespace) -> dict:
    """The engine on the AsyncEngine's thread (built there, as the server builds it), consumed by asyncio in
    this thread: no HTTP."""
    trace = new_trace()
    engine = AsyncEngine(make_config(args, trace))
    stubbed(engine.engine, args)

    async def one(prompt: list[int], n: int) -> None:
        async for out in engine.generate(prompt, params(n)):
            out.delta_text  # noqa: B018

    async def late(delay: float, prompt: list[int]) -> None:
        await asyncio.sleep(delay)
        await one(prompt, 2)

    async def run() -> None:
        await asyncio.gather(
            *(one(p, n) for p, n in zip(prompts(args), lengths(args), strict=True)),
            *(late(t, p) for t, p in arrivals(args)),
        )

    start = time.perf_counter()
    asyncio.run(run())
    wall = time.perf_counter() - start
    engine.shutdown()
    return {"wall_s": wall, **decode_steps(trace)}


def load(
    port: int,
    model: str,
    prompt_list: list[list[int]],
    tokens: list[int],
    late: list[tuple[float, list[int]]],
) -> tuple[list[int], float]:
    """Concurrent streamed completions, and the `late` ones sent after their delays: the data chunks each
    received, and the seconds they took."""

    async def one(client: httpx.AsyncClient, prompt: list[int], n: int) -> int:
        body = {"model": model, "prompt": prompt, "max_tokens": n, "stream": True,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        chunks = 0
        async with client.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                chunks += line.startswith("data: {")
        return chunks

    async def later(client: httpx.AsyncClient, delay: float, prompt: list[int]) -> int:
        await asyncio.sleep(delay)
        return await one(client, prompt, 2)

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as client:
            return await asyncio.gather(
                *(one(client, p, n) for p, n in zip(prompt_list, tokens, strict=True)),
                *(later(client, t, p) for t, p in late),
            )

    start = time.perf_counter()
    chunks = asyncio.run(run())
    return chunks, time.perf_counter() - start


def served(args: argparse.Namespace) -> dict:
    trace = new_trace()
    engine = AsyncEngine(make_config(args, trace))
    stubbed(engine.engine, args)
    config = engine.engine.config
    app = build_app(engine, config)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    model = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
    # the clients parse their streams in another process, as real clients do: not under the server's GIL
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        chunks, wall = pool.apply(load, (port, model, prompts(args), lengths(args), arrivals(args)))
    server.should_exit = True
    thread.join(timeout=30)
    engine.shutdown()
    return {"wall_s": wall, "chunks": sum(chunks), **decode_steps(trace)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=48)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--preset", help="a model preset (default: the tiny model with a stub forward)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--cache-bytes", type=int, default=1 << 30, help="KV + state budget")
    p.add_argument("--arrivals", type=int, default=0, help="short requests sent while the streams decode")
    p.add_argument("--arrival-tokens", type=int, default=128)
    p.add_argument("--arrival-gap", type=float, default=0.25, help="seconds between arrivals")
    p.add_argument(
        "--arrival-start",
        type=float,
        default=0.25,
        help="seconds before the first arrival (let the streams decode)",
    )
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    warm = {"streams": 2, "tokens": 8, "arrivals": 1, "arrival_gap": 0, "arrival_start": 0}
    direct(argparse.Namespace(**{**vars(args), **warm}))  # warm-up: lazy set-up, compiles
    rows = {"direct (main thread)": direct(args)}
    # each threaded mode in a fresh process whose main thread never ran torch ops, as in `flashstate serve`
    for mode, fn in (("engine thread, no HTTP", threaded), ("server, streaming clients", served)):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            rows[mode] = pool.submit(fn, args).result()
    print(f"\n{args.preset or 'stub'} on {args.device}: {args.streams} streams × {args.tokens} tokens, "
          f"prompts of {args.prompt_tokens}")  # fmt: skip
    print("| mode | wall s | decode steps | ms / decode step | mean batch | per seq ms | base ms "
          "| prefill steps | ms / prefill step (mean, median) | chunks |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode, r in rows.items():
        mean, median = r["prefill_step_ms_mean"], r["prefill_step_ms_median"]
        prefill_ms = mean and f"{mean:.2f}, {median:.2f}"
        print(f"| {mode} | {r['wall_s']:.2f} | {r['decode_steps']} | {r['decode_step_ms_mean']:.2f} "
              f"| {r['decode_batch_mean']:.1f} | {r['per_seq_ms']:.3f} | {r['base_ms']:.2f} "
              f"| {r['prefill_steps']} | {prefill_ms or '–'} "
              f"| {r.get('chunks', '–')} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
