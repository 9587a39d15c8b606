"""The bench replay (bench/replay.py) in simulated time: the same lanes, session draw, prompts, sub-agents,
think times, window, drain and records, against SimEngines instead of a server.

Differences from a measured run, by construction:
  - TTFT and e2e are engine times (queue + steps) plus the profile's request overhead (HTTP, the
    prompt's JSON, the server's event loop, its template and tokenizer), by which a request reaches its
    engine after it is sent; in chat mode the part that grows with the prompt runs on a CPU its server's
    chat requests share (sim/shared_cpu.py), so prompts sent together arrive later than one sent alone;
  - chat mode sends token prompts with checkpoint hints at segment ends; the profile's chat costs stand for
    the server's template (tokens added to each message, fixed per segment so a later turn re-sends them
    unchanged) and for the engine thread's share in rendering and tokenizing it; of an
    answer the trace marks `thinking`, the first `chat_thinking_share` of the generated ids stands for
    the reasoning and is not re-sent (bench/chat.py cuts the text the same way), so the next prompt
    leaves the previous turn's path at its prompt's end, as it does through a chat template; with
    `unspliced_per_token` q, a reply of L tokens comes back as other ids with chance 1 − (1 − q)^L and the
    next prompt leaves the path at its first token (a recorded run's server before 85d4391 re-tokenized a
    reply holding a special token its text hid: 3 of the default tokenizer's 2,048 ids);
  - several engines: a top-level session and its sub-agents go to one engine (session affinity, by a
    stable hash of the draw-unique session id).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Generator
from dataclasses import asdict, dataclass
from typing import Any

from flashstate.bench.config import ReplayConfig
from flashstate.bench.metrics import RequestRecord, SessionRecord, agent_of
from flashstate.bench.prompts import BlockTokens, PromptBuilder, Segment, context_len, scaled
from flashstate.bench.replay import ReplayResult, SessionSource, count_requests
from flashstate.bench.workloads import Session
from flashstate.engine.scheduler import RequestTooLargeError
from flashstate.sim.engine import SimEngine
from flashstate.sim.events import EventLoop, Join, Process, Sleep, Wait
from flashstate.sim.profile import ChatCosts, RequestOverhead
from flashstate.sim.shared_cpu import SharedCPU


class ByteBlockTokens(BlockTokens):
    """BlockTokens with ids in [0, 256) from a seeded byte stream: the same sharing structure (same key →
    same ids), much cheaper to draw, and every id a shared small int (8 bytes a token in memory)."""

    def __init__(self, tokens_per_block: int, seed: int = 0):
        super().__init__(tokens_per_block, seed, 256)

    def _ids(self, key: tuple) -> list[int]:
        ids = self._cache.get(key)
        if ids is None:
            ids = list(random.Random(_stable_seed(self.seed, *key)).randbytes(self.tokens_per_block))
            if len(self._cache) >= self._cache_blocks:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = ids
        return ids


@dataclass(slots=True)
class _Done:
    output: list[int]
    too_long: bool = False
    prompt_tokens: int = 0  # the prompt as the engine saw it (with a chat template's ids)


def _stable_seed(*key: Any) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


def _template_ids(text: list[int], n: int) -> list[int]:
    """`n` ids standing for what a chat template adds to a message of `text`: a function of the message
    alone, so the same message re-sent in a later turn is the same tokens."""
    if n <= 0:
        return []
    rng = random.Random(hash((len(text), *text[:64])))  # an int tuple's hash is the same in every process
    return [rng.randrange(256) for _ in range(n)]


def session_key(sid: str) -> str:
    """A session id without its draw numbers (`trace_0387#37/sub` -> `trace_0387/sub`): the same session in
    two runs that drew it at different times."""
    return re.sub(r"#\d+", "", sid)


def route(sid: str, num_engines: int) -> int:
    """Session affinity: the engine of a top-level session (and its sub-agents)."""
    if num_engines == 1:
        return 0
    return _stable_seed(agent_of(sid)) % num_engines


class SimReplay:
    def __init__(
        self,
        config: ReplayConfig,
        engines: list[SimEngine],
        loop: EventLoop,
        source: SessionSource,
        overhead: RequestOverhead | None = None,
        chat: ChatCosts | None = None,
        send_times: dict[tuple[str, int], float] | None = None,
        unspliced_per_token: float = 0.0,
    ):
        self.config = config
        # chat mode: the chance per reply token that the next turn re-sends the reply as other ids
        self.unspliced_per_token = unspliced_per_token
        # (session, turn) -> when a recorded run sent it: sent then, or when its previous turn ends if later
        self.send_times = send_times
        self.overhead = overhead  # a request's time from its send to its engine (None: none)
        self.chat = chat or ChatCosts()  # chat mode's template tokens and engine-thread time
        self.engines = engines
        self.loop = loop
        self._cpus = [SharedCPU(loop) for _ in engines]  # each engine's server prepares its requests
        self.source = source
        self._builders: dict[int, PromptBuilder] = {}
        self.requests: list[RequestRecord] = []
        self.sessions: list[SessionRecord] = []
        self.stopped: float | None = None
        self._sent = 0
        self._inflight = 0
        self._lanes_left = config.agents
        self._kick_pending = [False] * len(engines)

    # ---- engines --------------------------------------------------------------------------------

    def _kick(self, e: int) -> None:
        if self.engines[e].busy or self._kick_pending[e]:
            return
        self._kick_pending[e] = True
        self.loop.at(self.loop.now, lambda: self._tick(e))

    def _tick(self, e: int) -> None:
        self._kick_pending[e] = False
        engine = self.engines[e]
        if engine.busy:
            return
        run = engine.start_decode_run(self.loop.next_time() - self.loop.now)
        if run is not None:

            def run_done() -> None:
                engine.finish_decode_run()
                self._tick(e)

            self.loop.at(self.loop.now + run[1], run_done)
            return
        started = engine.start_step()
        if started is not None:
            batch, seconds = started

            def done() -> None:
                engine.finish_step(batch)
                self._tick(e)

            self.loop.at(self.loop.now + seconds, done)
            return
        landing = engine.next_restore()
        if landing is not None:  # idle until a host restore lands
            self.loop.at(landing, lambda: self._tick(e))

    # ---- agents ---------------------------------------------------------------------------------

    def _builder(self, session: Session) -> PromptBuilder:
        cfg = self.config
        b = self._builders.get(session.block_size)
        if b is None:
            blocks = ByteBlockTokens(scaled(session.block_size, cfg.length_scale), cfg.seed)
            b = self._builders[session.block_size] = PromptBuilder(blocks, cfg.length_scale)
        return b

    def _think(self, seconds: float) -> float:
        wait = seconds * self.config.time_scale
        if self.config.max_think_s is not None:
            wait = min(wait, self.config.max_think_s)
        return max(wait, 0.0)

    def _wait(self, sid: str, turn: int, think_s: float) -> float:
        """Seconds until the turn is sent: its think time, or the recorded run's send time where one is
        given for it."""
        sent = None if self.send_times is None else self.send_times.get((session_key(sid), turn))
        return self._think(think_s) if sent is None else max(0.0, sent - self.loop.now)

    def _unspliced(self, sid: str, turn: int, length: int) -> bool:
        """Whether the reply of `length` tokens to the session's turn comes back re-tokenized, not as the
        ids the engine generated (a fixed draw per session and turn, so every policy sees the same)."""
        if self.unspliced_per_token <= 0:
            return False
        chance = 1 - (1 - self.unspliced_per_token) ** length
        return random.Random(_stable_seed("unspliced", self.config.seed, sid, turn)).random() < chance

    def _stop(self) -> None:
        if self.stopped is None:
            self.stopped = self.loop.now

    def _send(
        self,
        proc: Process,
        lane: int,
        sid: str,
        depth: int,
        turn: int,
        context: list[Segment],
        max_tokens: int,
        target: int,
        frontier: int | None,
    ) -> None:
        cfg = self.config
        self._sent += 1
        if self._sent >= cfg.max_requests:
            self._stop()
        prompt: list[int] = []
        hints: list[int] | None = [] if cfg.mode == "chat" else None  # chat mode: each message's end
        for i, s in enumerate(context):
            prompt.extend(s.ids)
            if hints is not None:
                prompt.extend(_template_ids(s.ids, self.chat.template_tokens(len(s.ids), i == 0)))
                hints.append(len(prompt))
        engine_s = self.chat.engine_per_token_s * len(prompt) if hints is not None else 0.0
        sent = context_len(context)
        t_send = self.loop.now
        e = route(sid, len(self.engines))
        first: list[float] = []

        def record(t_end: float | None, seq: Any, error: str | None, too_long: bool) -> None:
            self.requests.append(
                RequestRecord(
                    lane=lane,
                    session=sid,
                    depth=depth,
                    turn=turn,
                    t_send=t_send,
                    ttft=first[0] - t_send if first else None,
                    e2e=None if t_end is None else t_end - t_send,
                    prompt_tokens=len(prompt),
                    cached_tokens=seq.stats.num_cached_tokens if seq is not None else 0,
                    output_tokens=(len(seq.token_ids) - seq.num_prompt_tokens) if seq is not None else 0,
                    sent_tokens=sent,
                    target_tokens=target,
                    max_tokens=max_tokens,
                    echoed=error is None,
                    error=error,
                    too_long=too_long,
                    frontier=frontier,
                )
            )

        holder: list[Any] = []

        def finished(now: float) -> None:
            self._inflight -= 1
            seq = holder[0]
            record(now, seq, None, False)
            self.loop.resume(proc, _Done(seq.output_token_ids, prompt_tokens=len(prompt)))

        def arrive() -> None:
            try:
                seq = self.engines[e].add(
                    f"{sid}:{turn}",
                    prompt,
                    max_tokens,
                    seed=_stable_seed(cfg.seed, sid, turn),
                    on_first_token=first.append,
                    on_finish=finished,
                    hint_positions=hints,
                    engine_seconds=engine_s,
                    first_step_seconds=self.chat.engine_per_admit_s if hints is not None else 0.0,
                )
            except RequestTooLargeError as err:
                self._inflight -= 1
                record(None, None, f"400: {err}", True)
                self.loop.at(self.loop.now, lambda: self.loop.resume(proc, _Done([], too_long=True)))
                return
            holder.append(seq)
            self._kick(e)

        self._inflight += 1  # from its send: one on its way to the engine counts
        if self.overhead is not None and hints is not None:
            # a chat prompt: the fixed part, then the prompt's part on its server's CPU, shared with the
            # other chat prompts there (the template and the splice run under the interpreter lock; a
            # token-mode prompt's part is not shared: on the card runs it does not grow with the crowd)
            work = self.overhead.per_token_s * len(prompt)
            self.loop.at(self.loop.now + self.overhead.base_s, lambda: self._cpus[e].submit(work, arrive))
            return
        delay = self.overhead(len(prompt)) if self.overhead is not None else 0.0
        if delay > 0:
            self.loop.at(self.loop.now + delay, arrive)
        else:
            arrive()

    def _session(
        self,
        proc_ref: list[Process],
        lane: int,
        session: Session,
        scope: str,
        sid: str,
        depth: int,
        rec: SessionRecord,
    ) -> Generator[Any, Any, bool]:
        """bench/replay.py's Replay._session, step for step."""
        cfg = self.config
        builder = self._builder(session)
        pending = [self._sub(lane, s, scope, sid, depth, rec) for s in session.subagents]
        context: list[Segment] = []
        prev = None
        last: _Done | None = None  # the previous turn's answer
        for k, req in enumerate(session.requests):
            if pending:
                joined = yield Join(pending)
                pending = []
                if not all(joined):
                    return False
            yield Sleep(self._wait(sid, k, req.think_time))
            before = context_len(context)
            context, plan = builder.next_context(context, scope, prev, req)
            frontier = None
            if last is not None and plan.kept == before:  # as bench/replay.py counts it
                frontier = last.prompt_tokens + max(0, len(last.output) - 1)
            max_tokens = builder.output_len(req)
            if cfg.max_output_tokens is not None:
                max_tokens = min(max_tokens, cfg.max_output_tokens)
            if cfg.max_context is not None and context_len(context) + max_tokens > cfg.max_context:
                rec.truncated = True
                break
            if self.stopped is not None:
                return False
            self._send(
                proc_ref[0], lane, sid, depth, k, context, max_tokens, builder.input_len(req), frontier
            )
            done = yield Wait()
            if done.too_long:
                rec.truncated = True
                break
            rec.done += 1
            last = done
            output = done.output
            if cfg.mode == "chat" and "thinking" in req.output_types:
                output = output[int(len(output) * cfg.chat_thinking_share) :]
            if cfg.mode == "chat" and self._unspliced(sid, k, len(done.output)):
                output = [(i + 1) % 256 for i in output]  # every id differs: off the path at its first
            context.append(Segment("assistant", output))
            pending = [self._sub(lane, s, scope, sid, depth, rec) for s in req.subagents]
            prev = req
        return all((yield Join(pending))) if pending else True

    def _process(self, make: Any) -> Process:
        """Spawn a process whose generator needs a reference to its own Process (to be resumed)."""
        ref: list[Process] = []
        gen = make(ref)
        proc = Process(gen)
        ref.append(proc)
        self.loop.resume(proc, None)
        return proc

    def _sub(
        self, lane: int, sub: Session, scope: str, parent: str, depth: int, rec: SessionRecord
    ) -> Process:
        sid = f"{parent}/{sub.id.rsplit('/', 1)[-1]}"
        return self._process(lambda ref: self._session(ref, lane, sub, scope, sid, depth + 1, rec))

    def _lane(self, lane: int) -> Generator[Any, Any, None]:
        yield Sleep(lane * self.config.ramp_s / self.config.agents)
        while self.stopped is None:
            drawn = self.source.draw()
            if drawn is None:
                break
            session, scope, sid = drawn
            rec = SessionRecord(lane, sid, count_requests(session), self.loop.now)
            self.sessions.append(rec)
            top = self._process(lambda ref: self._session(ref, lane, session, scope, sid, 0, rec))  # noqa: B023
            (ok,) = yield Join([top])
            if ok:
                rec.t_end = self.loop.now
        self._lanes_left -= 1
        if self._lanes_left == 0:
            self._stop()

    # ---- the run --------------------------------------------------------------------------------

    def run(self) -> ReplayResult:
        cfg = self.config
        end = cfg.warmup_s + cfg.duration_s
        self.loop.at(end, self._stop)
        for lane in range(cfg.agents):
            self.loop.spawn(self._lane(lane))

        def until() -> float | None:
            if self.stopped is None:
                return None
            self.loop.halted = True  # lanes are cancelled; requests in flight finish (drain)
            return self.stopped + cfg.drain_s if self._inflight else self.stopped

        self.loop.run(until)
        self.loop.halted = True
        return ReplayResult(
            config=asdict(cfg),
            model=None,
            max_model_len=self.engines[0].max_model_len,
            max_context=cfg.max_context,
            started_at=0.0,
            wall_s=self.loop.now,
            stopped_s=self.stopped if self.stopped is not None else self.loop.now,
            requests=self.requests,
            sessions=self.sessions,
            cut_requests=self._inflight,
        )
