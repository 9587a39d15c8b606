"""What the HTTP layer costs per streamed token: the real server (FastAPI + uvicorn on loopback, the real
AsyncEngine) over an engine whose model forward is a stub, against the same engine stepped directly.

    PYTHONPATH=. .venv/bin/python benchmarks/cpu_server_stream.py [--streams 48] [--tokens 200]

`--streams` clients each stream one completion of `--tokens` tokens (token-id prompts of 512 tokens), all
at once. The engine's own time per step comes from its step trace; the rest of the wall time per step is
what the event loop's streaming work (and the GIL it holds) adds; the clients run in a process of their
own. Prints one table.
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
from pathlib import Path

import httpx
import uvicorn

from flashstate import EngineConfig, SamplingParams
from flashstate.engine.async_engine import AsyncEngine
from flashstate.engine.llm_engine import LLMEngine
from flashstate.server.app import build_app

sys.path.insert(0, str(Path(__file__).parent))
from cpu_decode_host import StubModel  # noqa: E402


def stub_engine(streams: int, tokens: int, trace: str | None) -> LLMEngine:
    config = EngineConfig(
        max_model_len=512 + tokens + 16,
        max_num_seqs=streams,
        max_num_batched_tokens=8192,
        kv_cache_memory_bytes=1 << 30,
        prefill_cost_coefficients=(1e-6, 1e-12),
        enable_prefix_caching=False,
        step_trace=trace,
    )
    engine = LLMEngine(config)
    engine.runner.model = StubModel(engine.model, engine.spec.vocab_size)
    return engine


def prompts(streams: int) -> list[list[int]]:
    return [[100 + (7 * i + j) % 1500 for j in range(512)] for i in range(streams)]


def direct(streams: int, tokens: int) -> dict:
    engine = stub_engine(streams, tokens, None)
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=tokens)
    for p in prompts(streams):
        engine.add_request(p, params)
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished():
        for out in engine.step():
            out.delta_text  # noqa: B018 — what a streaming consumer reads
        steps += 1
    return {"steps": steps, "wall_s": time.perf_counter() - start}


def load(port: int, streams: int, tokens: int) -> tuple[list[int], float]:
    """`streams` concurrent streamed completions: the data chunks each received, and the seconds they took."""

    async def one(client: httpx.AsyncClient, prompt: list[int]) -> int:
        body = {"model": "flashstate-tiny", "prompt": prompt, "max_tokens": tokens, "stream": True,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        chunks = 0
        async with client.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                chunks += line.startswith("data: {")
        return chunks

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts(streams)))

    start = time.perf_counter()
    chunks = asyncio.run(run())
    return chunks, time.perf_counter() - start


def served(streams: int, tokens: int) -> dict:
    trace = str(Path(tempfile.mkdtemp()) / "steps.jsonl")
    engine = AsyncEngine(engine=stub_engine(streams, tokens, trace))
    app = build_app(engine, engine.engine.config)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)

    # the clients parse their streams in another process, as real clients do: not under the server's GIL
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        chunks, wall = pool.apply(load, (port, streams, tokens))
    server.should_exit = True
    thread.join(timeout=30)
    rows = [json.loads(line) for line in Path(trace).read_text().splitlines()]
    return {
        "steps": len(rows),
        "wall_s": wall,
        "engine_s": sum(r["ms"] for r in rows) / 1e3,
        "chunks": sum(chunks),
        "decode_batch_mean": sum(r["decode_seqs"] for r in rows) / max(len(rows), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=48)
    p.add_argument("--tokens", type=int, default=200)
    args = p.parse_args()
    d = direct(args.streams, args.tokens)
    s = served(args.streams, args.tokens)
    tokens = args.streams * args.tokens
    print(f"| {args.streams} streams × {args.tokens} tokens | steps | ms / step | tokens / s | chunks sent |")
    print("|---|---|---|---|---|")
    print(f"| engine stepped directly | {d['steps']} | {1e3 * d['wall_s'] / d['steps']:.2f} "
          f"| {tokens / d['wall_s']:,.0f} | – |")  # fmt: skip
    step_ms, engine_ms = 1e3 * s["wall_s"] / s["steps"], 1e3 * s["engine_s"] / s["steps"]
    print(f"| through the server | {s['steps']} | {step_ms:.2f} (engine {engine_ms:.2f}) "
          f"| {tokens / s['wall_s']:,.0f} | {s['chunks']} |")  # fmt: skip


if __name__ == "__main__":
    main()
