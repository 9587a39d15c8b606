"""Small simulated runs: the shipped H200 profile, a policy, a workload."""

from __future__ import annotations

from dataclasses import replace

from flashstate.bench.config import ReplayConfig
from flashstate.bench.replay import ReplayResult, SessionSource
from flashstate.bench.workloads import Request, Session
from flashstate.sim.command import engine_config, make_engines
from flashstate.sim.engine import SimEngine
from flashstate.sim.events import EventLoop
from flashstate.sim.profile import load_profile
from flashstate.sim.replay import SimReplay


def run(
    sessions,
    policy: str,
    serve_args: list[str] | None = None,
    decode_runs: bool = True,
    profile: str | None = None,
    unspliced_per_token: float = 0.0,
    **replay,
) -> tuple[ReplayResult, list[SimEngine]]:
    profile = load_profile(profile)
    config = engine_config(profile, serve_args or [], policy)
    loop = EventLoop()
    cfg = ReplayConfig(progress=False, **({"duration_s": 1e9, "max_sessions": len(sessions)} | replay))
    engines = make_engines(profile, config, cfg.num_gpus, loop)
    for e in engines:
        e.decode_runs = decode_runs
    cfg = replace(cfg, max_context=engines[0].max_model_len)
    source = SessionSource(sessions, cfg.seed, cfg.max_sessions)
    overhead = profile.request_overhead_for(cfg.mode)
    result = SimReplay(
        cfg, engines, loop, source, overhead, profile.chat, unspliced_per_token=unspliced_per_token
    ).run()
    return result, engines


def growing(sid: str, turns: int, first: int, step: int, out: int = 50, think: float = 2.0) -> Session:
    """An agent whose prompt grows by `step` tokens a turn; `first` and `step` chosen so that prompts end
    mid-block (not at a multiple of 64, nor of vLLM's 1152-token align block)."""
    reqs = []
    for k in range(turns):
        n = first + k * step
        reqs.append(Request(n, out, tuple(range(1, n // 64 + 1)), think if k else 0.0))
    return Session(sid, tuple(reqs), 64, sid)
