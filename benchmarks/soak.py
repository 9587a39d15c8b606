"""Soak: a real `flashstate serve` (embedded model, a small cache so eviction runs all the time) under N
agents for a while, each running multi-turn chat sessions (every turn re-sends the history and the previous
reply; greedy, ignore_eos, a fixed max_tokens), mixed with what clients do wrong:

- disconnects mid-stream (the session's turn is cut there: the session ends),
- aborts (the HTTP connection closed right after the request was sent),
- oversized requests (prompt past --max-model-len; body past --max-request-body-bytes, with and without a
  Content-Length),
- malformed JSON, wrong types, bad fields (each must get a 4xx).

Measures: requests by kind and status, 5xx (must be 0), aborts and disconnects, the server's RSS (VmRSS,
sampled every few seconds: after the warm-up and at the end), blocks and state slots leaked at the end
(/reset_prefix_cache once nothing runs: 0 expected), and output mismatches: after the run and a cache
reset, every completed turn is sent again (the same messages, one turn at a time per session) and its text
compared with the text the soak got (0 expected).

    python benchmarks/soak.py --duration 1200 --agents 16 --out benchmarks/results/.../soak.md
    python benchmarks/soak.py --duration 60 --agents 4 --json result.json     # the bounded test's run

Exits 1 when any 5xx was seen, anything leaked, any text mismatched, or the server died."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import datetime
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HOST = "127.0.0.1"
TIE = 1e-4  # logprob difference under which two greedy choices count as a near tie
MODEL = "flashstate-tiny"
WORDS = ["the", "function", "returns", "a", "list", "of", "tokens", "when", "cache", "misses", "we",
         "recompute", "prefix", "and", "store", "checkpoint", "at", "end", "each", "message", "agent", "tool",
         "call", "read", "file", "write", "patch", "test", "fails", "because", "index", "is", "off", "by",
         "one", "fix", "it", "run", "again"]  # fmt: skip
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
_USER = [{"role": "user", "content": "x"}]
MALFORMED: list[tuple[str, bytes]] = (
    [
        (CHAT, b'{"messages": ['),
        (CHAT, b"not json at all"),
        (CHAT, b"\xff\xfe\x00{"),
        (CHAT, b"[]"),
        (CHAT, b""),
        (COMPLETIONS, b'{"prompt": [1, 2], "temperature": NaN}'),
        (COMPLETIONS, b'{"prompt": "x", "max_tokens": 1e999}'),
    ]
    + [
        (CHAT, json.dumps(body).encode())
        for body in (
            {"messages": "hi"},
            {"messages": []},
            {"messages": [{"role": "robot", "content": "x"}]},
            {"messages": [{"role": "user"}]},
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            {"messages": _USER, "n": 0},
            {"messages": _USER, "model": "gpt-9"},
            {"messages": _USER, "max_tokens": 0},
            {"messages": _USER, "tool_choice": "required"},
            {"messages": _USER, "chat_template_kwargs": {"messages": []}},
        )
    ]
    + [
        (COMPLETIONS, json.dumps(body).encode())
        for body in (
            {"prompt": [1, 2], "max_tokens": "ten"},
            {"prompt": [1, 2], "temperature": -1},
            {"prompt": [1, 2], "top_p": 0},
            {"prompt": [1, 2], "seed": 2**70},
            {"prompt": [1, 2], "stop_token_ids": [2**70]},
            {"prompt": [1, 2], "logprobs": 99},
            {"prompt": [99_999_999], "max_tokens": 2},
            {"prompt": []},
            {"prompt": [1.5, 2]},
            {"prompt": [1, 2], "stream_options": {"include_usage": True}},
        )
    ]
)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class Reply:
    text: str
    prompt_tokens: int | None
    lps: list[tuple[str, float]]  # (token text, logprob) of each generated token


def _lps(choice: dict) -> list[tuple[str, float]]:
    content = (choice.get("logprobs") or {}).get("content") or ()
    return [(t["token"], t["logprob"]) for t in content]


def near_tie(soak: list[tuple[str, float]], replay: list[tuple[str, float]]) -> bool:
    """The texts differ only from a near tie on: the same tokens with the same logprobs (within TIE) up to
    the first token that differs, and there both chosen tokens equally likely (within TIE). Greedy decoding
    of a near tie may go either way when the batch or the prefix-cache hit differs (the engine is exact to
    about 1e-5 in the logits); a wrong state would show as different logprobs before or at that token."""
    j = next((i for i, (a, b) in enumerate(zip(soak, replay, strict=False)) if a[0] != b[0]), None)
    if j is None:
        return False
    return all(abs(soak[i][1] - replay[i][1]) <= TIE for i in range(j + 1))


@dataclass
class Session:
    agent: int
    index: int
    turns: list[tuple[list[dict], Reply]] = field(default_factory=list)  # (messages sent, reply)
    cut: bool = False  # its last turn was cut by a disconnect


@dataclass
class Stats:
    statuses: collections.Counter = field(default_factory=collections.Counter)  # (kind, status) → n
    server_errors: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)  # a 2xx where a 4xx was due, a transport error
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, KiB)
    aborts: int = 0
    disconnects: int = 0

    def record(self, kind: str, status: int, body: bytes | str = b"") -> None:
        self.statuses[(kind, status)] += 1
        if status >= 500:
            text = body if isinstance(body, str) else body.decode(errors="replace")
            self.server_errors.append(f"{kind}: {status} {text[:300]}")


class Soak:
    def __init__(self, args: argparse.Namespace, url: str, pid: int):
        self.args, self.url, self.pid = args, url, pid
        self.port = int(url.rsplit(":", 1)[1])
        self.stats = Stats()
        self.sessions: list[Session] = []
        self.mismatched: list[dict] = []  # the request bodies of mismatching turns, with both texts
        self.t0 = time.monotonic()

    # ---- one chat turn ------------------------------------------------------------------------------

    def _body(self, messages: list[dict], stream: bool) -> dict:
        return {
            "model": MODEL,
            "messages": messages,
            "max_tokens": self.args.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": True,  # the chosen tokens' logprobs: a mismatch at a near tie is told apart
            "stream": stream,
        }

    async def _turn(self, client: httpx.AsyncClient, messages: list[dict], stream: bool, kind: str):
        """(status, Reply or None) of one complete turn."""
        body = self._body(messages, stream)
        if not stream:
            r = await client.post("/v1/chat/completions", json=body)
            self.stats.record(kind, r.status_code, r.content)
            if r.status_code != 200:
                return r.status_code, None
            out = r.json()
            choice = out["choices"][0]
            return 200, Reply(choice["message"]["content"], out["usage"]["prompt_tokens"], _lps(choice))
        body["stream_options"] = {"include_usage": True}
        parts, lps, prompt_tokens = [], [], None
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                raw = await r.aread()
                self.stats.record(kind, r.status_code, raw)
                return r.status_code, None
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    self.stats.record(kind, 500, json.dumps(event))  # an error inside a 200 stream
                    return 500, None
                for choice in event.get("choices", ()):
                    parts.append(choice["delta"].get("content") or "")
                    lps += _lps(choice)
                if event.get("usage"):
                    prompt_tokens = event["usage"]["prompt_tokens"]
        self.stats.record(kind, 200)
        return 200, Reply("".join(parts), prompt_tokens, lps)

    # ---- what clients do wrong ---------------------------------------------------------------------

    async def _raw(self, payload: bytes, read_events: int | None) -> None:
        """Send one HTTP request on a fresh connection; close it at once (read_events None) or after that
        many stream events."""
        reader, writer = await asyncio.open_connection(HOST, self.port)
        try:
            writer.write(payload)
            await writer.drain()
            if read_events is not None:
                seen = 0
                while seen < read_events:
                    line = await asyncio.wait_for(reader.readline(), 300)
                    if not line:
                        break
                    seen += line.startswith(b"data: ")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _request_bytes(self, path: str, body: bytes) -> bytes:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {HOST}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def abort(self, messages: list[dict], rng: random.Random) -> None:
        body = json.dumps(self._body(messages, rng.random() < 0.5)).encode()
        await self._raw(self._request_bytes("/v1/chat/completions", body), None)
        self.stats.aborts += 1
        self.stats.statuses[("abort", 0)] += 1

    async def disconnect(self, messages: list[dict], rng: random.Random) -> None:
        body = json.dumps(self._body(messages, True)).encode()
        await self._raw(self._request_bytes("/v1/chat/completions", body), rng.randint(1, 4))
        self.stats.disconnects += 1
        self.stats.statuses[("disconnect", 0)] += 1

    async def expect_4xx(self, client: httpx.AsyncClient, kind: str, path: str, content) -> None:
        r = await client.post(path, content=content, headers={"Content-Type": "application/json"})
        self.stats.record(kind, r.status_code, r.content)
        if r.status_code < 400:
            self.stats.unexpected.append(f"{kind}: {r.status_code} for {str(content)[:200]}")

    async def misbehave(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        what = rng.random()
        if what < 0.35:
            path, body = rng.choice(MALFORMED)
            await self.expect_4xx(client, "malformed", path, body)
        elif what < 0.6:  # past the context: token ids, or one long message
            n = self.args.max_model_len + rng.randint(1, 200)
            if rng.random() < 0.5:
                body = {"prompt": [rng.randrange(1, 2000) for _ in range(n)], "max_tokens": 4}
                await self.expect_4xx(client, "over_context", COMPLETIONS, json.dumps(body).encode())
            else:
                text = " ".join(rng.choice(WORDS) for _ in range(n))
                body = self._body([{"role": "user", "content": text}], False)
                await self.expect_4xx(client, "over_context", CHAT, json.dumps(body).encode())
        elif what < 0.8:  # past the body limit, with a Content-Length
            body = b'{"prompt": "' + b"x" * (self.args.max_request_body_bytes + 1024) + b'"}'
            await self.expect_4xx(client, "over_body", "/v1/completions", body)
        else:  # past the body limit, chunked (no Content-Length)
            size = self.args.max_request_body_bytes + 1024

            async def chunks():
                yield b'{"prompt": "'
                for _ in range(0, size, 65536):
                    yield b"x" * 65536
                yield b'"}'

            await self.expect_4xx(client, "over_body_chunked", "/v1/completions", chunks())

    # ---- agents -----------------------------------------------------------------------------------

    def _user_text(self, rng: random.Random) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))

    async def agent(self, i: int, deadline: float) -> None:
        rng = random.Random(self.args.seed * 1000 + i)
        a = self.args
        async with httpx.AsyncClient(base_url=self.url, timeout=600) as client:
            index = 0
            while time.monotonic() < deadline:
                session = Session(i, index)
                index += 1
                self.sessions.append(session)
                history = [{"role": "system", "content": f"You are agent {i}. " + self._user_text(rng)}]
                for _ in range(rng.randint(2, a.turns)):
                    if time.monotonic() >= deadline:
                        break
                    messages = [*history, {"role": "user", "content": self._user_text(rng)}]
                    chaos = rng.random()
                    try:
                        if chaos < a.p_misbehave:
                            await self.misbehave(client, rng)
                        elif chaos < a.p_misbehave + a.p_abort:
                            await self.abort(messages, rng)
                        if rng.random() < a.p_disconnect:
                            await self.disconnect(messages, rng)
                            session.cut = True
                            break
                        status, reply = await self._turn(client, messages, rng.random() < 0.5, "turn")
                    except (TimeoutError, httpx.HTTPError, OSError) as e:
                        self.stats.unexpected.append(f"agent {i}: {type(e).__name__}: {e}")
                        break
                    if status != 200:
                        break  # a 400 past the context ends the session; a 5xx is counted
                    session.turns.append((messages, reply))
                    history = [*messages, {"role": "assistant", "content": reply.text}]
                    prompt_tokens = reply.prompt_tokens
                    if prompt_tokens is not None and prompt_tokens + 4 * a.max_tokens + 600 > a.max_model_len:
                        break  # the next turn would not fit

    async def sample_rss(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            kib = rss_kib(self.pid)
            if kib is not None:
                self.stats.rss.append((time.monotonic() - self.t0, kib))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.args.rss_interval)

    # ---- the end: leaks and the clean replay --------------------------------------------------------

    async def pools(self, client: httpx.AsyncClient) -> dict:
        """/reset_prefix_cache once nothing runs or waits (aborted requests leave within a few steps)."""
        for _ in range(600):
            r = await client.post("/reset_prefix_cache")
            self.stats.record("reset", r.status_code, r.content)
            out = r.json()
            if r.status_code == 200 and out["running"] == 0 and out["waiting"] == 0:
                return out
            await asyncio.sleep(0.5)
        return out

    async def replay(self) -> tuple[int, list[str]]:
        queue: asyncio.Queue[Session] = asyncio.Queue()
        for s in self.sessions:
            if s.turns:
                queue.put_nowait(s)
        count, mismatches, ties = 0, [], []

        async def worker() -> None:
            nonlocal count
            async with httpx.AsyncClient(base_url=self.url, timeout=600) as client:
                while not queue.empty():
                    session = queue.get_nowait()
                    for k, (messages, reply) in enumerate(session.turns):
                        status, again = await self._turn(client, messages, False, "replay")
                        count += 1
                        if again is not None and again.text == reply.text:
                            continue
                        tie = again is not None and near_tie(reply.lps, again.lps)
                        text = again.text if again is not None else None
                        (ties if tie else mismatches).append(
                            f"agent {session.agent} session {session.index} turn {k}: status {status}, "
                            f"soak {reply.text!r:.80} replay {text!r:.80}"
                        )
                        if not tie:
                            self.mismatched.append(
                                {"body": self._body(messages, False), "soak": reply.text, "replay": text}
                            )

        await asyncio.gather(*(worker() for _ in range(self.args.agents)))
        return count, mismatches, ties

    async def run(self) -> dict:
        a = self.args
        stop = asyncio.Event()
        sampler = asyncio.create_task(self.sample_rss(stop))
        deadline = self.t0 + a.duration
        await asyncio.gather(*(self.agent(i, deadline) for i in range(a.agents)))
        soak_seconds = time.monotonic() - self.t0
        async with httpx.AsyncClient(base_url=self.url, timeout=600) as client:
            after = await self.pools(client)
            end_rss = rss_kib(self.pid)
            replay_start = time.monotonic()
            replayed, mismatches, ties = await self.replay() if not a.no_replay else (0, [], [])
            replay_seconds = time.monotonic() - replay_start
            final = await self.pools(client)
            health = (await client.get("/health")).status_code
        stop.set()
        await sampler
        warm = [kib for t, kib in self.stats.rss if t >= a.warmup] or [kib for _, kib in self.stats.rss]
        turns = sum(len(s.turns) for s in self.sessions)
        statuses = collections.Counter()
        for (_, status), n in self.stats.statuses.items():
            statuses[status] += n
        return {
            "duration_s": round(soak_seconds, 1),
            "agents": a.agents,
            "sessions": len(self.sessions),
            "sessions_cut": sum(s.cut for s in self.sessions),
            "completed_turns": turns,
            "requests": sum(self.stats.statuses.values()),
            "by_kind": {f"{kind} {status}": n for (kind, status), n in sorted(self.stats.statuses.items())},
            "by_status": {str(k): v for k, v in sorted(statuses.items())},
            "server_errors_5xx": len(self.stats.server_errors),
            "server_error_samples": self.stats.server_errors[:10],
            "unexpected": self.stats.unexpected[:10],
            "unexpected_count": len(self.stats.unexpected),
            "aborts": self.stats.aborts,
            "disconnects": self.stats.disconnects,
            "rss_start_mib": round(warm[0] / 1024, 1) if warm else None,
            "rss_end_mib": round(end_rss / 1024, 1) if end_rss else None,
            "rss_max_mib": round(max(k for _, k in self.stats.rss) / 1024, 1) if self.stats.rss else None,
            "rss_samples": [(round(t), k) for t, k in self.stats.rss],
            "leaked_blocks": after["num_blocks"] - after["free_blocks"],
            "leaked_state_slots": after["num_state_slots"] - after["free_state_slots"],
            "leaked_after_replay": (final["num_blocks"] - final["free_blocks"])
            + (final["num_state_slots"] - final["free_state_slots"]),
            "num_blocks": after["num_blocks"],
            "num_state_slots": after["num_state_slots"],
            "replayed_turns": replayed,
            "replay_s": round(replay_seconds, 1),
            "mismatches": len(mismatches),
            "mismatch_samples": mismatches[:10],
            "mismatch_requests": self.mismatched[:5],
            "near_ties": len(ties),
            "turns_without_logprobs": sum(not r.lps for s in self.sessions for _, r in s.turns),
            "near_tie_samples": ties[:10],
            "health_at_end": health,
        }


def start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [
        sys.executable, "-m", "flashstate.cli", "serve", "--host", HOST, "--port", str(port),
        "--kv-cache-memory-bytes", args.kv_cache_memory_bytes, "--max-model-len", str(args.max_model_len),
        "--max-request-body-bytes", str(args.max_request_body_bytes),
        "--prefill-cost-coefficients", "1e-5", "1e-10", "--enable-dev-endpoints", *args.server_arg,
    ]  # fmt: skip
    with open(log, "wb") as out:
        env = {k: v for k, v in os.environ.items() if k not in ("FLASHSTATE_API_KEY", "VLLM_API_KEY")}
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server not ready after 300 s")


def table(r: dict) -> str:
    rows = [
        ("duration (s), agents", f"{r['duration_s']}, {r['agents']}"),
        ("sessions (cut by a disconnect)", f"{r['sessions']} ({r['sessions_cut']})"),
        ("completed turns", r["completed_turns"]),
        ("requests", r["requests"]),
        ("by status (0: aborted / disconnected)", ", ".join(f"{k}: {v}" for k, v in r["by_status"].items())),
        ("aborts, disconnects", f"{r['aborts']}, {r['disconnects']}"),
        ("5xx", r["server_errors_5xx"]),
        ("2xx where a 4xx was due, transport errors", r["unexpected_count"]),
        ("server RSS after warm-up → end (max), MiB",
         f"{r['rss_start_mib']} → {r['rss_end_mib']} ({r['rss_max_mib']})"),
        ("leaked blocks / state slots", f"{r['leaked_blocks']} / {r['leaked_state_slots']} "
         f"(of {r['num_blocks']} / {r['num_state_slots']})"),
        ("replayed turns, mismatches (+ near ties)",
         f"{r['replayed_turns']}, {r['mismatches']} (+ {r['near_ties']})"),
        ("/health at the end", r["health_at_end"]),
    ]  # fmt: skip
    return "| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=1200, help="seconds of traffic (default 20 minutes)")
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--turns", type=int, default=8, help="most turns in a session")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--kv-cache-memory-bytes", default="16M")
    p.add_argument("--max-request-body-bytes", type=int, default=1 << 20)
    p.add_argument("--p-misbehave", type=float, default=0.15, help="chance of a bad request before a turn")
    p.add_argument("--p-abort", type=float, default=0.1, help="chance of an aborted copy of a turn")
    p.add_argument("--p-disconnect", type=float, default=0.05, help="chance a turn is cut mid-stream")
    p.add_argument("--warmup", type=float, default=60, help="seconds before the start RSS sample")
    p.add_argument("--rss-interval", type=float, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-replay", action="store_true")
    p.add_argument("--server-arg", action="append", default=[], help="extra flashstate serve argument")
    p.add_argument("--json", help="write the result as JSON here")
    p.add_argument("--out", help="write the table, command, machine and date as markdown here")
    p.add_argument("--machine", default="2-core CPU box")
    args = p.parse_args(argv)
    args.warmup = min(args.warmup, args.duration / 4)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        log = Path(tmp) / "server.log"
        proc, url = start_server(args, log)
        try:
            result = asyncio.run(Soak(args, url, proc.pid).run())
            result["server_alive"] = proc.poll() is None
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        result["server_exit"] = proc.returncode
        if result["server_errors_5xx"] or not result["server_alive"]:
            print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
    command = shlex.join(["python", "benchmarks/soak.py", *(sys.argv[1:] if argv is None else argv)])
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "command": command}, indent=1))
    for name in ("server_error_samples", "unexpected", "mismatch_samples", "near_tie_samples"):
        for line in result[name]:
            print(f"{name}: {line}")
    text = table(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            f"# Soak: {args.agents} agents, {args.duration:g} s\n\n"
            f"Machine: {args.machine}. Date: {datetime.date.today().isoformat()}.\n\n"
            f"```\n{command}\n```\n\n{text}\n"
        )
    print(text)
    failed = (
        result["server_errors_5xx"] or result["leaked_blocks"] or result["leaked_state_slots"]
        or result["mismatches"] or not result["server_alive"] or result["health_at_end"] != 200
    )  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
