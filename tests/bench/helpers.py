"""Shared helpers: replay a workload against an in-process fake server; a small growing session."""

import asyncio

from flashstate.bench.replay import Replay, ReplayConfig, ReplayResult, SessionSource
from flashstate.bench.workloads import Request, Session

from .fake_server import FakeServer


def run(server: FakeServer, sessions, **kw) -> ReplayResult:
    async def go():
        url = await server.start()
        try:
            config = ReplayConfig(base_url=url, progress=False, **kw)
            return await Replay(config, SessionSource(sessions, config.seed, config.max_sessions)).run()
        finally:
            await server.stop()

    return asyncio.run(asyncio.wait_for(go(), 60))


def chain(sid: str, turns: int = 3, think: float = 1.0, subagents=()) -> Session:
    """A session growing by one 4-token block per turn (+ output), with `subagents` after turn 0."""
    reqs = []
    for k in range(turns):
        n = 10 + 6 * k
        reqs.append(
            Request(n, 2, tuple(range(1, n // 4 + 1)), think if k else 0.0, subagents if k == 0 else ())
        )
    return Session(sid, tuple(reqs), 4, sid)
