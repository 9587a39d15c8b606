"""A minimal OpenAI-compatible streaming server for the replay client's tests (asyncio, HTTP/1.1 with
`Connection: close`, 127.0.0.1 only). It fakes a prefix cache by policy:

    flashstate   cached = longest prefix shared with any earlier prompt + output
    vllm         cached = longest prefix shared with an earlier prompt, floored to `block` tokens
    none         0
and records every request (body, arrival and finish times, prompt and cached tokens).

`python -m tests.bench.fake_server --port P --cache-policy X [--echo-ids]` serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

CACHE_POLICIES = ("flashstate", "vllm", "sglang", "none")


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Seen:
    path: str
    body: dict[str, Any]
    t_arrive: float
    prompt: list[int]
    cached: int = 0
    t_done: float | None = None


@dataclass
class FakeServer:
    policy: str = "flashstate"
    echo_ids: bool = False
    block: int = 16
    max_model_len: int = 100_000
    token_delay_s: float = 0.0
    first_token_delay_s: float = 0.0
    fail: Any = None  # callable(body) -> bool: answer 500
    cut: Any = None  # callable(body) -> bool: end the stream after one token, no [DONE] (a dead replica)
    seen: list[Seen] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    sequences: list[list[int]] = field(default_factory=list)  # prompt + output
    prompt_tokens: int = 0
    cached_tokens: int = 0
    _server: asyncio.AbstractServer | None = None

    async def start(self, port: int = 0) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _cached(self, prompt: list[int]) -> int:
        if self.policy == "none":
            return 0
        if self.policy == "vllm":
            best = max((_common(prompt, p) for p in self.prompts), default=0)
            best = best // self.block * self.block
        else:
            best = max((_common(prompt, s) for s in self.sequences), default=0)
        return min(best, len(prompt) - 1)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            method, path, _ = head.split("\r\n", 1)[0].split(" ")
            headers = {
                k.strip().lower(): v.strip()
                for k, v in (line.split(":", 1) for line in head.split("\r\n")[1:] if ":" in line)
            }
            body = await reader.readexactly(int(headers.get("content-length", 0)))
            await self._route(method, path, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _respond(writer: asyncio.StreamWriter, status: str, ctype: str, payload: bytes) -> None:
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"
            f"Connection: close\r\n\r\n".encode()
            + payload
        )

    async def _route(self, method: str, path: str, raw: bytes, writer: asyncio.StreamWriter) -> None:
        if method == "GET" and path == "/health":
            self._respond(writer, "200 OK", "text/plain", b"ok")
        elif method == "GET" and path == "/v1/models":
            card = {"id": "fake", "object": "model", "max_model_len": self.max_model_len}
            self._respond(writer, "200 OK", "application/json", json.dumps({"data": [card]}).encode())
        elif method == "GET" and path == "/metrics":
            text = (
                f'vllm:prompt_tokens_total{{model_name="fake"}} {self.prompt_tokens}\n'
                f'vllm:prefix_cache_hits_total{{model_name="fake"}} {self.cached_tokens}\n'
                f'vllm:request_latency_bucket{{le="1.0"}} 3\n'
            )
            self._respond(writer, "200 OK", "text/plain", text.encode())
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            await self._generate(path, json.loads(raw), writer)
        else:
            self._respond(writer, "404 Not Found", "text/plain", b"")
        await writer.drain()

    async def _generate(self, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        if "messages" in body:  # chat: one pseudo-token per word, role markers included
            words = " ".join(f"<{m['role']}> {m['content']}" for m in body["messages"]).split()
            prompt = [zlib.crc32(w.encode()) % 50_000 for w in words]
        else:
            prompt = list(body["prompt"])
        seen = Seen(path, body, time.perf_counter(), prompt)
        self.seen.append(seen)
        if self.fail is not None and self.fail(body):
            err = {"error": {"message": "injected failure", "type": "server_error", "code": 500}}
            self._respond(writer, "500 Internal Server Error", "application/json", json.dumps(err).encode())
            seen.t_done = time.perf_counter()
            return
        if len(prompt) + body["max_tokens"] > self.max_model_len:
            err = {
                "error": {
                    "message": "too long",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            }
            self._respond(writer, "400 Bad Request", "application/json", json.dumps(err).encode())
            seen.t_done = time.perf_counter()
            return
        seen.cached = self._cached(prompt)
        self.prompts.append(prompt)
        self.prompt_tokens += len(prompt)
        self.cached_tokens += seen.cached
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        await asyncio.sleep(self.first_token_delay_s)
        out = [(sum(prompt) + i) % 1000 for i in range(body["max_tokens"])]
        chat = "messages" in body
        for tok in out:
            choice: dict[str, Any] = (
                {"index": 0, "delta": {"content": f"w{tok} "}} if chat else {"index": 0, "text": f"w{tok} "}
            )
            if self.echo_ids:
                choice["token_ids"] = [tok]
            writer.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            await writer.drain()
            if self.cut is not None and self.cut(body):
                seen.t_done = time.perf_counter()
                return
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(out),
            "prompt_tokens_details": {"cached_tokens": seen.cached},
        }
        writer.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        self.sequences.append(prompt + ([] if chat else out))
        seen.t_done = time.perf_counter()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cache-policy", default="flashstate", choices=CACHE_POLICIES)
    p.add_argument("--echo-ids", action="store_true")
    p.add_argument("--step-trace")  # the real server's step log; nothing steps here
    args = p.parse_args()

    async def run() -> None:
        server = FakeServer(policy=args.cache_policy, echo_ids=args.echo_ids)
        await server.start(args.port)
        await asyncio.sleep(600)  # bounded: a forgotten server exits on its own

    asyncio.run(run())


if __name__ == "__main__":
    main()
