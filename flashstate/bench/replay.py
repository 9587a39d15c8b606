"""The replay client: N agent lanes against one OpenAI-compatible server (asyncio + httpx, streaming).

A lane draws a session, replays it turn by turn, and draws the next when it ends (closed loop):

    lane:  think → request 0 → [sub-agents ∥] → think → request 1 → ... → next session
                              └ each sub-agent: its own turns, joined before request 1

A request is sent `think_time · time_scale` (capped by `max_think_s`) after the previous one finished and
its sub-agents joined; `max_tokens` is the recorded `out` (scaled) with `ignore_eos`. The agent's context
grows as `prompts.PromptBuilder` says; the output stays in it when the server echoes its token ids (chat
mode: always, as the assistant message chat.py makes of the reply). A prompt that would not fit
`max_context` ends its session (`truncated`). A turn that re-sends its whole previous context records
that turn's prompt + output − 1 as its `frontier`: the most a cache could serve if the server saw the
same tokens again (chat mode: the re-rendered history may leave them earlier).

The run: lanes start staggered over `ramp_s`, warm up for `warmup_s`, then `duration_s` are measured. It
stops sending at the window's end, after `max_requests` sends, or when `max_sessions` sessions have
finished — whichever comes first; requests in flight then get `drain_s` to finish (so slow requests are
measured, not censored), the rest are cancelled and counted as `cut_requests`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from flashstate.bench import chat, client
from flashstate.bench.config import ReplayConfig
from flashstate.bench.metrics import RequestRecord, SessionRecord, parse_prometheus
from flashstate.bench.progress import Progress
from flashstate.bench.prompts import (
    BlockTokens,
    PromptBuilder,
    Segment,
    context_len,
    scaled,
)
from flashstate.bench.workloads import Session
from flashstate.gc_pauses import GcPauses, for_serving


class SessionSource:
    """Deterministic draw order: a list is shuffled per pass (a repeated session gets fresh content:
    its hash scope carries the pass number), an iterator (synthetic) is read as is."""

    def __init__(self, sessions: list[Session] | Iterator[Session], seed: int = 0, limit: int | None = None):
        self._list = list(sessions) if isinstance(sessions, list) else None
        self._iter = sessions if self._list is None else None
        self._rng = random.Random(seed)
        self._order: list[int] = []
        self._epoch = -1
        self.drawn = 0
        self.limit = limit
        if self._list is not None and not self._list:
            raise ValueError("no sessions to replay")

    def has_tools(self) -> bool:
        """Might a session carry tool definitions (`tool_tokens`)? A stream (synthetic) always might."""
        if self._list is None:
            return True
        return any("tool_tokens" in s.meta for top in self._list for _, s in top.walk())

    def draw(self) -> tuple[Session, str, str] | None:
        """(session, hash scope, draw-unique id), or None when `limit` sessions were drawn."""
        if self.limit is not None and self.drawn >= self.limit:
            return None
        self.drawn += 1
        if self._list is None:
            s = next(self._iter)
            return s, s.scope, f"{s.id}#{self.drawn - 1}"
        if not self._order:
            self._epoch += 1
            self._order = list(range(len(self._list)))
            self._rng.shuffle(self._order)
            self._order.reverse()
        s = self._list[self._order.pop()]
        suffix = f"@{self._epoch}" if self._epoch else ""
        return s, s.scope + suffix, f"{s.id}#{self.drawn - 1}"


def count_requests(session: Session) -> int:
    return sum(len(s.requests) for _, s in session.walk())


@dataclass(slots=True)
class ReplayResult:
    config: dict[str, Any]
    model: str | None
    max_model_len: int | None
    max_context: int | None
    started_at: float  # unix time
    wall_s: float
    stopped_s: float  # when sending stopped (the window ends here at the latest)
    requests: list[RequestRecord] = field(default_factory=list)
    sessions: list[SessionRecord] = field(default_factory=list)
    server_before: dict[str, float] | None = None
    server_after: dict[str, float] | None = None
    cut_requests: int = 0  # still running after the drain: cancelled, not recorded
    client_gc: str | None = None  # this process's garbage-collector pauses during the run (GcPauses)


RETRY_BACKOFF_S = 0.5  # before a retry, times the attempt number


async def fetch_metrics(http: httpx.AsyncClient, base_url: str) -> dict[str, float] | None:
    """The server's /metrics; behind a router that lists its replicas (GET /list_workers: vllm-router,
    sglang-router), every replica's, summed (a replica that does not answer is left out)."""
    try:
        listed = await http.get(f"{base_url}/list_workers", timeout=10.0)
        urls = listed.json()["urls"] if listed.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        urls = None
    merged: dict[str, float] | None = None
    for url in urls if isinstance(urls, list) and urls else [base_url]:
        try:
            resp = await http.get(f"{str(url).rstrip('/')}/metrics", timeout=10.0)
        except httpx.HTTPError:
            continue
        if resp.status_code == 200:
            merged = merged or {}
            for name, value in parse_prometheus(resp.text).items():
                merged[name] = merged.get(name, 0.0) + value
    return merged


async def server_model(http: httpx.AsyncClient, base_url: str) -> tuple[str | None, int | None]:
    """The first served model's id and max_model_len, (None, None) when /v1/models does not answer."""
    try:
        resp = await http.get(f"{base_url}/v1/models", timeout=10.0)
        card = resp.json()["data"][0]
        return card.get("id"), card.get("max_model_len")
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None, None


class Replay:
    def __init__(self, config: ReplayConfig, source: SessionSource):
        self.config = config
        self.source = source
        self._builders: dict[int, PromptBuilder] = {}  # by block size
        self.requests: list[RequestRecord] = []
        self.sessions: list[SessionRecord] = []
        self._sent = 0
        self._stop = asyncio.Event()
        self._inflight: set[asyncio.Task] = set()
        self.cut = 0  # requests still running after the drain time: cancelled, not recorded
        self._t0 = 0.0
        self._model: str | None = None
        self._max_context: int | None = None
        self._per_word = 1.0  # chat mode: the server's tokens per word (chat.calibrate)
        self._tool_choice = "auto"  # chat mode: "none" where the server has no tool-call parser
        self._http: httpx.AsyncClient | None = None

    def _builder(self, session: Session) -> PromptBuilder:
        cfg = self.config
        b = self._builders.get(session.block_size)
        if b is None:
            blocks = BlockTokens(scaled(session.block_size, cfg.length_scale), cfg.seed, cfg.max_token_id)
            b = self._builders[session.block_size] = PromptBuilder(blocks, cfg.length_scale)
        return b

    def _too_long(self, context: list[Segment], max_tokens: int) -> bool:
        """Would the prompt + output pass `max_context`? In chat mode too by the trace's length, not the
        server's count (the template adds a few percent): both modes replay the same sessions to the same
        turns, as the simulator does; a prompt the server refuses as too long ends its session as well."""
        if self._max_context is None:
            return False
        return context_len(context) + max_tokens > self._max_context

    def _chat_info(self) -> dict[str, Any]:
        return {"chat_tokens_per_word": self._per_word, "chat_tool_choice": self._tool_choice}

    async def _think(self, seconds: float) -> None:
        wait = seconds * self.config.time_scale
        if self.config.max_think_s is not None:
            wait = min(wait, self.config.max_think_s)
        if wait > 0:
            await asyncio.sleep(wait)

    async def _send(
        self,
        lane: int,
        sid: str,
        depth: int,
        turn: int,
        context: list[Segment],
        max_tokens: int,
        target: int,
        frontier: int | None = None,
    ) -> client.Completion:
        cfg = self.config
        if cfg.mode == "chat":
            messages, tools = chat.render(context, self._per_word)
            body = client.chat_body(
                self._model, messages, max_tokens, cfg.temperature, tools, self._tool_choice
            )
            url = f"{cfg.base_url}/v1/chat/completions"
        else:
            prompt = [i for s in context for i in s.ids]
            body = client.completion_body(self._model, prompt, max_tokens, cfg.temperature)
            url = f"{cfg.base_url}/v1/completions"
        self._sent += 1
        if self._sent >= cfg.max_requests:
            self._stop.set()
        sizes = (context_len(context), max_tokens, target, frontier)
        for attempt in range(cfg.retries + 1):
            where = (lane, sid, depth, turn, time.perf_counter())
            task = asyncio.create_task(self._request(url, body, where, sizes))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            c = await asyncio.shield(task)  # a lane cancelled at the window's end leaves it to drain
            if c.error is None or not c.retryable or attempt == cfg.retries or self._stop.is_set():
                return c
            await asyncio.sleep(RETRY_BACKOFF_S * (attempt + 1))  # the failed attempt stays recorded
        return c

    async def _request(
        self,
        url: str,
        body: dict[str, Any],
        where: tuple[int, str, int, int, float],
        sizes: tuple[int, int, int, int | None],
    ) -> client.Completion:
        cfg = self.config
        lane, sid, depth, turn, t_send = where
        sent, max_tokens, target, frontier = sizes
        c = await client.stream(self._http, url, body, cfg.request_timeout_s, t_send)
        done = c.error is None
        self.requests.append(
            RequestRecord(
                lane=lane,
                session=sid,
                depth=depth,
                turn=turn,
                t_send=c.t_send - self._t0,
                ttft=None if c.t_first is None else c.t_first - c.t_send,
                e2e=None if c.t_end is None or not done else c.t_end - c.t_send,
                prompt_tokens=c.prompt_tokens if c.prompt_tokens is not None else sent,
                cached_tokens=c.cached_tokens or 0,
                output_tokens=c.completion_tokens or len(c.token_ids or ()),
                sent_tokens=sent,
                target_tokens=target,
                max_tokens=max_tokens,
                echoed=done and (cfg.mode == "chat" or c.token_ids is not None),
                error=c.error,
                too_long=c.too_long,
                frontier=frontier,
                tool_calls=sum(len(m.get("tool_calls") or ()) for m in body.get("messages", ())),
                tool_results=sum(m["role"] == "tool" for m in body.get("messages", ())),
            )
        )
        return c

    async def _session(
        self, lane: int, session: Session, scope: str, sid: str, depth: int, rec: SessionRecord
    ) -> bool:
        """Replay one session (and its sub-agents); False if a request failed."""
        cfg = self.config
        builder = self._builder(session)
        pending = [asyncio.create_task(self._sub(lane, s, scope, sid, depth, rec)) for s in session.subagents]
        context: list[Segment] = []
        prev = None
        last: client.Completion | None = None  # the previous turn's answer
        try:
            for k, req in enumerate(session.requests):
                if pending:
                    joined = await asyncio.gather(*pending)
                    pending = []
                    if not all(joined):
                        return False
                await self._think(req.think_time)
                before = context_len(context)
                context, plan = builder.next_context(context, scope, prev, req)
                frontier = None
                if last is not None and plan.kept == before and last.prompt_tokens is not None:
                    # the last generated token was sampled, never run through the model: no state holds it
                    frontier = last.prompt_tokens + max(0, last.completion_tokens - 1)
                if cfg.mode == "chat":
                    new, head = context[-1], context[:-1]
                    if plan.kept == 0:
                        context = chat.first_turn(new, session, cfg.length_scale, cfg.chat_tools)
                    else:
                        context = [*head, chat.next_input(head, new, req)]
                max_tokens = builder.output_len(req)
                if cfg.max_output_tokens is not None:
                    max_tokens = min(max_tokens, cfg.max_output_tokens)
                if self._too_long(context, max_tokens):
                    rec.truncated = True
                    break
                if self._stop.is_set():
                    return False
                c = await self._send(
                    lane, sid, depth, k, context, max_tokens, builder.input_len(req), frontier
                )
                if c.too_long:  # the server counts more tokens than we estimated (chat mode)
                    rec.truncated = True
                    break
                if c.error is not None:
                    rec.failed = True
                    return False
                rec.done += 1
                last = c
                if cfg.mode == "chat":
                    context.append(
                        chat.assistant_turn(
                            c,
                            req,
                            builder.blocks,
                            scope,
                            k,
                            cfg.chat_thinking_share,
                            cfg.chat_tools,
                            self._per_word,
                        )
                    )
                elif c.token_ids is not None:
                    context.append(Segment("assistant", list(c.token_ids)))
                pending = [
                    asyncio.create_task(self._sub(lane, s, scope, sid, depth, rec)) for s in req.subagents
                ]
                prev = req
            return all(await asyncio.gather(*pending)) if pending else True
        finally:
            for t in pending:
                t.cancel()

    async def _sub(
        self, lane: int, sub: Session, scope: str, parent: str, depth: int, rec: SessionRecord
    ) -> bool:
        return await self._session(lane, sub, scope, f"{parent}/{sub.id.rsplit('/', 1)[-1]}", depth + 1, rec)

    async def _lane(self, lane: int) -> None:
        await asyncio.sleep(lane * self.config.ramp_s / self.config.agents)
        while not self._stop.is_set():
            drawn = self.source.draw()
            if drawn is None:
                return
            session, scope, sid = drawn
            rec = SessionRecord(lane, sid, count_requests(session), time.perf_counter() - self._t0)
            self.sessions.append(rec)
            if await self._session(lane, session, scope, sid, 0, rec):
                rec.t_end = time.perf_counter() - self._t0

    async def _watch(self, progress: Progress) -> None:
        while True:
            ok = [r for r in self.requests if r.error is None]
            prompt = sum(r.prompt_tokens for r in ok)
            progress.update(
                time.perf_counter() - self._t0,
                requests=len(self.requests),
                active=sum(s.t_end is None and not s.failed for s in self.sessions),
                completed=sum(s.complete for s in self.sessions),
                errors=len(self.requests) - len(ok),
                hit_rate=sum(r.cached_tokens for r in ok) / prompt if prompt else None,
            )
            await asyncio.sleep(0.5)

    async def run(self, http: httpx.AsyncClient | None = None) -> ReplayResult:
        cfg = self.config
        own = http is None
        self._http = http or httpx.AsyncClient(limits=httpx.Limits(max_connections=None))
        if cfg.api_key:
            self._http.headers["Authorization"] = f"Bearer {cfg.api_key}"
        try:
            model, max_model_len = await server_model(self._http, cfg.base_url)
            self._model = cfg.model or model
            self._max_context = cfg.max_context or max_model_len
            if cfg.mode == "chat":
                self._per_word = await chat.calibrate(self._http, cfg.base_url, self._model) or 1.0
                if cfg.chat_tools and self.source.has_tools():
                    self._tool_choice = await chat.tool_choice(self._http, cfg.base_url, self._model)
            before = await fetch_metrics(self._http, cfg.base_url)
            started, self._t0 = time.time(), time.perf_counter()
            total = cfg.warmup_s + cfg.duration_s
            lanes = [asyncio.create_task(self._lane(i)) for i in range(cfg.agents)]
            progress = Progress(total, cfg.warmup_s) if cfg.progress else None
            watch = asyncio.create_task(self._watch(progress)) if progress else None
            stop = asyncio.create_task(self._stop.wait())
            all_done = asyncio.gather(*lanes)
            await asyncio.wait([all_done, stop], timeout=total, return_when=asyncio.FIRST_COMPLETED)
            self._stop.set()
            stopped = time.perf_counter() - self._t0
            for t in [*lanes, stop]:
                t.cancel()
            await asyncio.gather(all_done, stop, return_exceptions=True)
            if self._inflight:  # requests sent before the end finish (their tokens past it are not counted)
                _, cut = await asyncio.wait(set(self._inflight), timeout=cfg.drain_s)
                self.cut = len(cut)
                for t in cut:
                    t.cancel()
                await asyncio.gather(*cut, return_exceptions=True)
            if watch:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
            if progress:
                progress.close()
            wall = time.perf_counter() - self._t0
            after = await fetch_metrics(self._http, cfg.base_url)
        finally:
            if own:
                await self._http.aclose()
        return ReplayResult(
            config=asdict(cfg) | (self._chat_info() if cfg.mode == "chat" else {}),
            model=self._model,
            max_model_len=max_model_len,
            max_context=self._max_context,
            started_at=started,
            wall_s=wall,
            stopped_s=stopped,
            requests=self.requests,
            sessions=self.sessions,
            server_before=before,
            server_after=after,
            cut_requests=self.cut,
        )


def replay(config: ReplayConfig, sessions: list[Session] | Iterator[Session]) -> ReplayResult:
    """Run a replay to the end (blocking)."""
    source = SessionSource(sessions, config.seed, config.max_sessions)
    # a collection pauses the clock of every request in flight: the workload and the rest of the start-up
    # are frozen out of the collector's walks (gc_pauses.py), and the pauses left are recorded
    for_serving()
    pauses = GcPauses().install()  # this run's alone
    try:
        result = asyncio.run(Replay(config, source).run())
    finally:
        pauses.uninstall()
    result.client_gc = pauses.describe()
    return result
