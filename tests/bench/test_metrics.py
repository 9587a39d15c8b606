import pytest

from flashstate.bench.cost import Prices, cost_view
from flashstate.bench.metrics import (
    RequestRecord,
    SessionRecord,
    metrics_delta,
    output_timeline,
    parse_prometheus,
    server_sum,
    summarize,
)


def rec(t_send, prompt, cached, out, ttft=0.5, e2e=1.5, session="s#0", error=None):
    return RequestRecord(
        lane=0,
        session=session,
        depth=0,
        turn=0,
        t_send=t_send,
        ttft=ttft,
        e2e=e2e,
        prompt_tokens=prompt,
        cached_tokens=cached,
        output_tokens=out,
        sent_tokens=prompt,
        target_tokens=prompt,
        max_tokens=out,
        echoed=False,
        error=error,
    )


def test_summary_over_the_window():
    reqs = [
        rec(1.0, 1000, 0, 10),  # warm-up: not measured
        rec(10.0, 1000, 900, 10, ttft=0.2),
        rec(20.0, 2000, 1000, 20, ttft=0.4),
        rec(30.0, 3000, 3000, 30, ttft=0.8),
        rec(40.0, 500, 0, 0, error="HTTP 500"),
        rec(80.0, 1000, 0, 10),  # after the window
    ]
    sessions = [
        SessionRecord(0, "s#0", 3, 10.0, 32.0, 3),
        SessionRecord(0, "t#1", 3, 1.0, 20.0, 3),
        SessionRecord(0, "u#2", 3, 30.0, None, 1),
    ]
    s = summarize(reqs, sessions, 5.0, 65.0, num_gpus=2)
    assert (s["requests"], s["errors"]) == (3, 1)
    assert (s["prompt_tokens"], s["cached_tokens"], s["uncached_tokens"]) == (6000, 4900, 1100)
    assert s["token_hit_rate"] == pytest.approx(4900 / 6000)
    assert s["uncached_tokens_per_request"] == {"p50": 100.0, "p90": pytest.approx(100 + 0.8 * 900)}
    assert s["ttft_s"]["p50"] == pytest.approx(0.4)
    assert s["ttft_s"]["p99"] == pytest.approx(0.4 + 0.98 * 0.4)
    assert s["output_tokens"] == 60.0 and s["output_tpm"] == pytest.approx(60.0)  # 60 tokens in a minute
    assert s["prefill_tpm_per_gpu"] == pytest.approx(1100 / 2)
    assert s["completed_agents"] == 1  # t#1 began in the warm-up, u#2 did not finish
    assert (s["run_requests"], s["run_cached_tokens"]) == (5, 4900)


def test_output_tokens_are_spread_over_the_stream():
    r = rec(0.0, 10, 0, 100, ttft=1.0, e2e=3.0)  # tokens stream from t=1 to t=3
    assert summarize([r], [], 2.0, 10.0)["output_tokens"] == pytest.approx(50.0)
    assert output_timeline([r], 4.0, 1.0) == pytest.approx([0.0, 50.0, 50.0, 0.0])
    assert summarize([], [], 0.0, 1.0)["token_hit_rate"] is None


def test_prometheus_parse_delta_and_sum():
    before = parse_prometheus(
        "# HELP vllm:prefix_cache_hits Prompt tokens restored.\n# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{model_name="m"} 100.0\n'
        'vllm:prefix_cache_hits_created{model_name="m"} 1.7e9\n'
        'vllm:ttft_seconds_bucket{le="0.1",model_name="m"} 4.0\n'
        'vllm:ttft_seconds_sum{model_name="m"} 0.3\n'
        'flashstate:evictions_total{model_name="m",reason="lru"} 2\n'
        'flashstate:evictions_total{model_name="m",reason="gds"} 1\n'
    )
    assert set(before) == {
        'vllm:prefix_cache_hits_total{model_name="m"}',
        'vllm:ttft_seconds_sum{model_name="m"}',
        'flashstate:evictions_total{model_name="m",reason="lru"}',
        'flashstate:evictions_total{model_name="m",reason="gds"}',
    }
    after = dict(before) | {
        'vllm:prefix_cache_hits_total{model_name="m"}': 250.0,
        "new_metric": 1.0,
        'flashstate:host_cache_engine_seconds_total{call="load"}': 2.5,
    }
    delta = metrics_delta(before, after)
    assert server_sum(delta, "vllm:prefix_cache_hits") == 150.0 and "new_metric" not in delta
    assert server_sum(delta, "flashstate:host_cache_engine_seconds") == 2.5  # a counter first seen after
    assert server_sum(before, "flashstate:evictions") == 3.0 and server_sum(before, "nope") is None


def test_cost_view():
    prices = Prices(gpu_per_hour=3.6, input_per_m=3.0, cached_input_per_m=0.3, output_per_m=15.0)
    reqs = [rec(10.0, 1_000_000, 500_000, 100_000, session="a#0"), rec(20.0, 0, 0, 0, session="a#0/sub")]
    assert prices.bill(reqs[0]) == pytest.approx(1.5 + 0.15 + 1.5)
    c = cost_view(reqs, [SessionRecord(0, "a#0", 2, 5.0, 30.0, 2)], 0.0, 100.0, prices, num_gpus=2)
    assert c["gpu_seconds"] == 200.0 and c["gpu_cost"] == pytest.approx(0.2)
    assert c["gpu_seconds_per_completed_agent"] == 200.0
    assert c["provider_cost_per_completed_agent"] == pytest.approx(0.2)
    assert c["user_bill_per_session"] == pytest.approx(3.15)  # the sub-agent's requests bill the session
    assert c["provider_profit_per_gpu_hour"] == pytest.approx((3.15 - 0.2) / (200 / 3600))
    assert cost_view([], [], 0.0, 10.0, prices)["gpu_seconds_per_completed_agent"] is None
