"""Issue 33's must-show: a replica SIGKILLed mid-run loses no session, and every greedy completion through
the fleet equals a single engine's for the same prompt.

Sessions of token-id turns (each prompt = the previous prompt + its output + new user tokens; temperature
0, a fixed max_tokens) are replayed in waves (every session's turn k, concurrently) first on one
`flashstate serve`, then through vllm-router before two replicas with the same flags whose host tiers
share one Mooncake master. The router runs round robin and a wave's requests reach it in session order
(each is sent once the one before has its response headers: it is on a replica): with an odd number of
sessions a session's consecutive turns land on different replicas. Between waves each replica's
write-backs are waited for, so the second wave resumes every session from the state the other replica
wrote, as deep as the single engine's own cache.

In the third wave replica 1 is SIGKILLed while it streams a request and started again at once on its port;
a request the kill cut is sent again (bench --retries' rule: bench/client.py's `retryable`,
RETRY_BACKOFF_S), and the later waves use the restarted replica. (A kill that cut nothing is repeated in the
next wave but the last.) After the kill a turn resumes from whatever states survived: the dead replica's
Mooncake segment held objects of every writer, so some turns find none and prefill, which must change no
output.

Each turn adds only 1-8 user tokens: the tiny model's linear-attention state fades within a few dozen
tokens, so only a short suffix after the restored depth lets a wrong restored state change the output."""

from __future__ import annotations

import asyncio
import random
import signal
from dataclasses import dataclass, field

import httpx

from flashstate.bench import client
from flashstate.bench.compare import ServerSpec, free_port
from flashstate.bench.metrics import parse_prometheus
from flashstate.bench.replay import RETRY_BACKOFF_S
from flashstate.fleet.launch import Fleet, FleetSpec, Replica, running_fleet
from tests.fleet.conftest import MODEL, SERVE, metric, skip_without_router, wait_until

skip_without_router()

SESSIONS = 5  # odd: round robin alternates a session's turns between the two replicas
TURNS = 5  # turn 1 restores across replicas; the kill in turn 2 (again in 3 if it cut nothing), never 4
MAX_TOKENS = 48  # a stream long enough that the kill, a /metrics sample after a token, lands inside one
RETRIES = 6  # as the fleet kill test's bench replay
VICTIM = 1
CACHE_POLICY = "flashstate"  # FleetSpec's default: the replicas' and the single engine's


def user_tokens(session: int, turn: int) -> list[int]:
    rng = random.Random(1009 * session + turn)
    n = rng.randint(96, 192) if turn == 0 else rng.randint(1, 8)
    return [rng.randrange(2000) for _ in range(n)]


@dataclass(slots=True)
class Turn:
    prompt: list[int]
    output: list[int]
    cached_tokens: int
    failed_attempts: list[str]  # errors of the attempts before the one that answered


@dataclass(slots=True)
class Run:
    """Every session's turns so far against one base URL (a server or the router)."""

    url: str
    turns: list[list[Turn]] = field(default_factory=lambda: [[] for _ in range(SESSIONS)])
    lost: dict[int, str] = field(default_factory=dict)  # session → the error that ended it

    async def wave(self, turn: int, fleet: Fleet | None = None) -> bool:
        """Every live session's turn `turn`, each sent once the one before it has its response headers
        (the router has chosen its replica): round robin takes them in session order. With `fleet`,
        SIGKILL its replica VICTIM once it streams a request, and start it again at once (its start-up
        overlaps the retries). True when it was killed (and has been started again)."""
        routed, killed = asyncio.Event(), asyncio.Event()

        async def on_response(response: httpx.Response) -> None:
            routed.set()

        async with (
            httpx.AsyncClient(event_hooks={"response": [on_response]}) as http,
            httpx.AsyncClient() as probe,
        ):
            killer = asyncio.create_task(_kill_when_streaming(probe, fleet, killed)) if fleet else None
            tasks = []
            for s in range(SESSIONS):
                if s in self.lost:
                    continue
                routed.clear()
                tasks.append(asyncio.create_task(self._turn(http, s, turn)))
                waiter = asyncio.create_task(routed.wait())
                await asyncio.wait([tasks[-1], waiter], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
            await asyncio.gather(*tasks)
            if killer is not None and not killed.is_set():
                killer.cancel()
            elif killer is not None:
                await killer
            return killed.is_set()

    async def _turn(self, http: httpx.AsyncClient, session: int, turn: int) -> None:
        history = self.turns[session]
        prompt = (history[-1].prompt + history[-1].output if history else []) + user_tokens(session, turn)
        body = client.completion_body(MODEL, prompt, MAX_TOKENS, 0.0)
        failed: list[str] = []
        for attempt in range(RETRIES + 1):
            c = await client.stream(http, f"{self.url}/v1/completions", body, 300.0)
            if c.error is None or not c.retryable or attempt == RETRIES:
                break
            failed.append(c.error)
            await asyncio.sleep(RETRY_BACKOFF_S * (attempt + 1))
        if c.error is not None or c.token_ids is None or len(c.token_ids) != MAX_TOKENS:
            self.lost[session] = f"turn {turn}: {c.error or c.token_ids}"
            return
        history.append(Turn(prompt, list(c.token_ids), c.cached_tokens or 0, failed))

    def cut(self, turn: int) -> int:
        """Requests of wave `turn` that had to be sent again."""
        return sum(bool(h[turn].failed_attempts) for h in self.turns if len(h) > turn)


async def _kill_when_streaming(http: httpx.AsyncClient, fleet: Fleet, killed: asyncio.Event) -> None:
    """SIGKILL the victim once it is running a request and generated tokens since the previous sample: a
    stream is under way on it (a request killed before its first token is sent again by the router
    itself, so a count since this began could be an earlier stream's while a new one prefills). Then
    start it again on its port and wait until it answers."""
    victim, before = fleet.replicas[VICTIM], None
    while True:
        try:
            m = parse_prometheus((await http.get(f"{victim.url}/metrics", timeout=10.0)).text)
        except httpx.HTTPError:
            m = {}
        tokens, running = _sample(m, "vllm:generation_tokens_total"), _sample(m, "vllm:num_requests_running")
        streaming = before is not None and running >= 1 and tokens > before
        before = tokens
        if streaming:
            victim.kill(signal.SIGKILL)
            killed.set()
            assert await asyncio.to_thread(fleet.restart_dead) == [VICTIM]
            return
        await asyncio.sleep(0.02)


def _sample(m: dict[str, float], name: str) -> float:
    return sum(v for k, v in m.items() if k.split("{")[0] == name)


_ENDED = ("flashstate:host_cache_states_written_total", "flashstate:host_cache_writes_skipped_total")


def _settle(replicas: list[Replica]) -> None:
    """Wait until every request each replica finished has had its write-back reach the store (or be
    dropped): the next wave's restores then find what this one wrote."""
    for r in replicas:
        done = r.url, "vllm:request_success_total"
        wait_until(lambda r=r, done=done: sum(metric(r.url, n) for n in _ENDED) >= metric(*done))


def test_a_replica_killed_mid_run_loses_no_session_and_greedy_outputs_equal_one_engine(tmp_path):
    port = free_port()  # the single engine: started with the fleet, run before it, stopped after its run
    one = Replica(
        0, ServerSpec(serve_args=SERVE).command(CACHE_POLICY, port), port, tmp_path / "single.log", 600
    )
    spec = FleetSpec(
        replicas=2, policy="round_robin", shared=True, host_cache_bytes="64M", cache_policy=CACHE_POLICY,
        serve_args=SERVE,
    )  # fmt: skip
    one.launch()
    try:
        with running_fleet(spec, tmp_path / "fleet") as fleet:
            one.wait()
            single = Run(one.url)
            for turn in range(TURNS):
                asyncio.run(single.wave(turn))
            one.stop()
            assert not single.lost, single.lost

            run, cut, remote = Run(fleet.url), 0, 0
            for turn in range(TURNS):
                armed = 2 <= turn < TURNS - 1 and cut == 0
                if asyncio.run(run.wave(turn, fleet if armed else None)):
                    cut += run.cut(turn)
                    wait_until(
                        lambda: (
                            httpx.get(f"{fleet.url}/readiness", timeout=10).json().get("healthy_workers") == 2
                        )
                    )
                if turn < TURNS - 1:
                    _settle(fleet.replicas)
                if turn == 1:  # before any kill: both replicas' counters
                    remote = sum(
                        metric(r.url, "flashstate:host_cache_remote_restores_total") for r in fleet.replicas
                    )
    finally:
        one.stop()

    assert not run.lost, run.lost  # 0 lost sessions
    assert cut >= 1, f"the kill cut no request (restarts {fleet.restarts})"
    differ = [
        f"session {s} turn {t}: fleet {a.output} (prompt equal: {a.prompt == b.prompt}, {a.cached_tokens} "
        f"cached, failed attempts {a.failed_attempts}), single {b.output} ({b.cached_tokens} cached)"
        for s in range(SESSIONS)
        for t, (a, b) in enumerate(zip(run.turns[s], single.turns[s], strict=True))
        if (a.prompt, a.output) != (b.prompt, b.output)
    ]
    detail = "\n".join(differ)
    assert not differ, f"{len(differ)} of {SESSIONS * TURNS} turns differ from one engine's:\n{detail}"
    # turn 1 resumed every session from the state the other replica wrote, as deep as one engine's cache
    depths = [(h[1].cached_tokens, o[1].cached_tokens) for h, o in zip(run.turns, single.turns, strict=True)]
    assert all(fleet_depth == single_depth > 0 for fleet_depth, single_depth in depths), depths
    assert remote == SESSIONS, remote
