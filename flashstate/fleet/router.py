"""The router in front of a fleet: vllm-router (PyPI `vllm-router`, a Rust load balancer; the `fleet` extra).

It works against flashstate's OpenAI endpoints unmodified: token-id and text prompts on /v1/completions,
/v1/chat/completions, streaming, /v1/models (forwarded to a replica), and it probes a replica's /health
only. sglang-router was tried too: it refuses token-id prompts on /v1/completions (422), which the bench
and agent frameworks send, so it is not the fleet's router.

Policies (`--policy`): cache_aware (a prefix tree of what each replica was sent: a session's next turn goes
where its prefix went, unless the load is out of balance), round_robin, power_of_two, consistent_hash,
random. Health: the router polls every replica's /health every `HEALTH_INTERVAL_S`; a replica that fails
`HEALTH_FAILURES` polls stops getting requests, and one that answers again rejoins. A request whose
replica refuses the connection is retried on another by the router; a stream cut by a replica's death
reaches the client as a stream without [DONE] (the bench retries it: bench/client.py).
"""

from __future__ import annotations

import os
import shutil
import sys

ROUTER = "vllm-router"
POLICIES = ("cache_aware", "round_robin", "power_of_two", "consistent_hash", "random")
HEALTH_INTERVAL_S = 1
HEALTH_FAILURES = 2


def router_executable() -> str:
    """`vllm-router` from this Python's environment, else from PATH."""
    here = os.path.join(os.path.dirname(sys.executable), ROUTER)
    found = here if os.access(here, os.X_OK) else shutil.which(ROUTER)
    if found is None:
        raise FileNotFoundError(f"{ROUTER} not found: pip install 'flashstate[fleet]' (or vllm-router)")
    return found


def router_command(
    workers: list[str], policy: str, host: str, port: int, metrics_port: int, extra: tuple[str, ...] = ()
) -> list[str]:
    if policy not in POLICIES:
        raise ValueError(f"router policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return [
        router_executable(),
        "--host", host,
        "--port", str(port),
        "--worker-urls", *workers,
        "--policy", policy,
        "--prometheus-host", host,
        "--prometheus-port", str(metrics_port),
        "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
        "--health-failure-threshold", str(HEALTH_FAILURES),
        "--health-success-threshold", "1",
        "--request-timeout-secs", "3600",
        "--log-level", "warning",
        *extra,
    ]  # fmt: skip
