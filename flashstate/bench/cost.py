"""The cost view: what a run's throughput means in money, for the provider and for the user.

    GPU-seconds per completed agent   window · GPUs / completed agents
    provider cost per completed agent GPU-seconds / 3600 · GPU price per hour
    user bill of a request            (uncached · input + cached · cached input + output · output) / 1e6
    user bill per session             mean bill of the sessions completed in the window
    provider profit per GPU-hour      (Σ bills in the window − GPU cost of the window) / GPU-hours

Defaults (documented, override with flags): $3.50 per GPU-hour (an on-demand H100/H200-class price) and
Claude Sonnet 4.5's list prices, $3 / $0.30 / $15 per million input / cached input / output tokens — the
price sheet of the agents whose traces are replayed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from flashstate.bench.metrics import RequestRecord, SessionRecord, agent_of


@dataclass(frozen=True, slots=True)
class Prices:
    gpu_per_hour: float = 3.50
    input_per_m: float = 3.00
    cached_input_per_m: float = 0.30
    output_per_m: float = 15.00

    def bill(self, r: RequestRecord) -> float:
        return (
            r.uncached_tokens * self.input_per_m
            + r.cached_tokens * self.cached_input_per_m
            + r.output_tokens * self.output_per_m
        ) / 1e6


def cost_view(
    requests: list[RequestRecord],
    sessions: list[SessionRecord],
    start: float,
    end: float,
    prices: Prices,
    num_gpus: int = 1,
) -> dict[str, Any]:
    ok = [r for r in requests if r.error is None and r.e2e is not None]
    inside = [r for r in ok if start <= r.t_send < end]
    gpu_s = (end - start) * num_gpus
    gpu_cost = gpu_s / 3600 * prices.gpu_per_hour
    completed = [s for s in sessions if s.complete and s.t_start >= start and s.t_end <= end]
    by_session: dict[str, float] = {}
    for r in ok:
        top = agent_of(r.session)
        by_session[top] = by_session.get(top, 0.0) + prices.bill(r)
    revenue = sum(prices.bill(r) for r in inside)
    bills = [by_session.get(s.session, 0.0) for s in completed]
    return {
        "prices": asdict(prices),
        "gpu_seconds": gpu_s,
        "gpu_cost": gpu_cost,
        "user_bills": revenue,
        "gpu_seconds_per_completed_agent": gpu_s / len(completed) if completed else None,
        "provider_cost_per_completed_agent": gpu_cost / len(completed) if completed else None,
        "user_bill_per_session": sum(bills) / len(bills) if bills else None,
        "user_bill_per_request": revenue / len(inside) if inside else None,
        "provider_profit_per_gpu_hour": (revenue - gpu_cost) / (gpu_s / 3600) if gpu_s > 0 else None,
    }
