"""Prometheus metrics for /metrics, in a registry of the app's own (several apps can live in one process).

Names that dashboards built for vLLM read (`vllm:`), each labelled `model_name`:
    vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc     gauges, read at scrape
    vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total                      prompt tokens looked up
                                                                                       / restored (vLLM's
                                                                                       token-based counters)
    vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:request_success_total{finished_reason},
    vllm:num_preemptions_total
    vllm:time_to_first_token_seconds, vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds,
    vllm:request_prefill_time_seconds, vllm:request_decode_time_seconds,
    vllm:request_time_per_output_token_seconds, vllm:request_prompt_tokens, vllm:request_generation_tokens
                                                                                       histograms
    vllm:cache_config_info                                                             labels only
Ours (`flashstate:`): requests restoring from the host tier, the oldest queued request's wait, preemptions
by kind (recompute, checkpoint), steps an aged request held admission back; prefix-cache requests and
request hits, uncached tokens, checkpoints held and their bytes, evictions by reason, refused admissions,
host-tier hits, the prefill cost coefficients a and b in use
(`flashstate:prefill_cost_coefficient{term}`), pool sizes and free counts, aborted and rejected requests,
on CUDA the caching allocator's retries; with a host tier (`flashstate:host_cache_*`): states and bytes
written, skipped write-backs, restored tokens, misses by reason (dropped by the store, corrupt), evictions,
outages and reconnects, whether the store is available, bytes and states held, and the engine thread's
seconds inside the tier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flashstate.engine.async_engine import AsyncEngine
from flashstate.engine.output.request_output import RequestOutput
from flashstate.engine.stats_snapshot import HostSnapshot, host_snapshot

_SECONDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
            20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_TOKENS = tuple(float(10**e * m) for e in range(7) for m in (1, 2, 5))


class ServerMetrics:
    def __init__(self, engine: AsyncEngine, model_name: str):
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        r, label = self.registry, ["model_name"]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*label, *extra], registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] = _SECONDS) -> Histogram:
            return Histogram(name, doc, label, buckets=buckets, registry=r)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed (prompt tokens).")
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens processed.")
        self.request_success = counter(
            "vllm:request_success", "Finished requests by finish reason.", ("finished_reason",)
        )
        self.preemptions = counter("vllm:num_preemptions", "Preemptions of finished requests.")
        self.aborted = counter(
            "flashstate:requests_aborted", "Requests aborted (client gone) before the end."
        )
        self.rejected = counter(
            "flashstate:requests_rejected", "Requests refused before queueing.", ("reason",)
        )
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token.")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.")
        self.queue = histogram("vllm:request_queue_time_seconds", "Arrival to leaving the waiting queue.")
        self.prefill = histogram("vllm:request_prefill_time_seconds", "Model time on the prompt.")
        self.decode = histogram("vllm:request_decode_time_seconds", "First token to finish.")
        self.tpot = histogram("vllm:request_time_per_output_token_seconds", "Mean time per output token.")
        self.request_prompt = histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", _TOKENS)
        self.request_generation = histogram(
            "vllm:request_generation_tokens", "Generated tokens per request.", _TOKENS
        )
        r.register(_EngineCollector(engine, model_name))

    def observe(self, out: RequestOutput, first: bool) -> None:
        """Per output of a request: token counters; at its end the latency histograms."""
        m = self.model_name
        if first:
            self.prompt_tokens.labels(m).inc(len(out.prompt_token_ids))
        self.generation_tokens.labels(m).inc(len(out.delta_token_ids))
        if not out.finished or out.finish_reason == "abort":
            return
        s = out.stats
        self.request_success.labels(m, out.finish_reason or "stop").inc()
        self.preemptions.labels(m).inc(s.num_preemptions)
        self.request_prompt.labels(m).observe(len(out.prompt_token_ids))
        self.request_generation.labels(m).observe(len(out.token_ids))
        self.prefill.labels(m).observe(s.prefill_seconds)
        if s.ttft is not None:
            self.ttft.labels(m).observe(s.ttft)
        if s.first_admitted_time is not None:
            self.queue.labels(m).observe(s.first_admitted_time - s.arrival_time)
        if s.finished_time is not None:
            self.e2e.labels(m).observe(s.finished_time - s.arrival_time)
            if s.first_token_time is not None:
                decode = s.finished_time - s.first_token_time
                self.decode.labels(m).observe(decode)
                if len(out.token_ids) > 1:
                    self.tpot.labels(m).observe(decode / (len(out.token_ids) - 1))


class _EngineCollector(Collector):
    """Gauges and cache counters from the engine's last per-step snapshot (engine/stats_snapshot.py)."""

    def __init__(self, engine: AsyncEngine, model_name: str):
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        llm = self.engine.engine
        s, config, m = llm.stats, llm.config, [self.model_name]
        stats = s.cache

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(m, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(m, value)
            return c

        yield gauge("vllm:num_requests_running", "Requests in the running batch.", s.running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting to run.", s.waiting)
        yield gauge(
            "flashstate:num_requests_restoring",
            "Requests admitted, their state on the way from the host tier.",
            s.restoring,
        )
        yield gauge(
            "flashstate:queue_oldest_wait_seconds",
            "How long the longest-waiting queued request has waited, at the last engine step.",
            s.oldest_wait_seconds,
        )
        preemptions = CounterMetricFamily(
            "flashstate:preemptions",
            "Running requests preempted, by kind (recompute: nothing kept; checkpoint: its state kept as a "
            "cache unit it resumes from).",
            labels=["model_name", "kind"],
        )
        preemptions.add_metric([*m, "recompute"], s.preemptions_recompute)
        preemptions.add_metric([*m, "checkpoint"], s.preemptions_checkpoint)
        yield preemptions
        yield counter(
            "flashstate:admission_blocked",
            "Steps in which an aged queued request did not fit beside the running set and held admission "
            "back.",
            s.admission_blocked,
        )
        yield gauge(
            "vllm:kv_cache_usage_perc",
            "Fraction of KV blocks not free.",
            1 - s.kv_blocks_free / max(s.kv_blocks_total, 1),
        )
        yield counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", stats.query_tokens
        )
        yield counter(
            "vllm:prefix_cache_hits", "Prompt tokens restored from the prefix cache.", stats.cached_tokens
        )
        yield counter(
            "flashstate:prefix_cache_requests", "Requests looked up in the prefix cache.", stats.queries
        )
        yield counter(
            "flashstate:prefix_cache_request_hits", "Requests that restored a hybrid state.", stats.hits
        )
        yield counter(
            "flashstate:prefix_cache_uncached_tokens", "Prompt tokens prefilled.", stats.uncached_tokens
        )
        yield counter(
            "flashstate:prefix_cache_admissions_refused",
            "Checkpoints the policy declined to keep.",
            stats.admissions_refused,
        )
        yield counter("flashstate:host_cache_hits", "Restores from the host tier.", stats.host_hits)
        yield gauge("flashstate:checkpoints", "Checkpoints held.", stats.checkpoints)
        yield gauge(
            "flashstate:checkpoint_bytes", "State bytes of the checkpoints held.", stats.checkpoint_bytes
        )
        evictions = CounterMetricFamily(
            "flashstate:prefix_cache_evictions",
            "Cache units evicted, by reason.",
            labels=["model_name", "reason"],
        )
        for reason, n in dict(stats.evictions).items():
            evictions.add_metric([*m, reason], n)
        yield evictions
        if llm.host is not None:
            yield from _host_metrics(host_snapshot(llm.host), gauge, counter, m)
        if llm.device.type == "cuda":  # a retry frees cached blocks: the device synchronises
            retries = torch.cuda.memory_stats(llm.device).get("num_alloc_retries", 0)
            yield counter("flashstate:cuda_alloc_retries", "CUDA caching-allocator retries.", retries)
        yield gauge("flashstate:kv_blocks_total", "KV blocks in the pool.", s.kv_blocks_total)
        yield gauge("flashstate:kv_blocks_free", "KV blocks free.", s.kv_blocks_free)
        yield gauge("flashstate:state_slots_total", "State slots in the pool.", s.state_slots_total)
        yield gauge("flashstate:state_slots_free", "State slots free.", s.state_slots_free)
        if s.cost is not None:
            kind, a, b = s.cost
            coef = GaugeMetricFamily(
                "flashstate:prefill_cost_coefficient",
                "Prefill cost C(n) = a·n + b·n² in use (seconds per token, per token²).",
                labels=["model_name", "term", "source"],
            )
            coef.add_metric([*m, "a", kind], a)  # a kind, never a path
            coef.add_metric([*m, "b", kind], b)
            yield coef
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Cache configuration (labels).",
            labels=["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_policy"],
        )
        info.add_metric(
            [
                *m,
                str(config.block_size),
                str(s.kv_blocks_total),
                str(config.prefix_caching),
                config.cache_policy,
            ],
            1,
        )
        yield info


def _host_metrics(host: HostSnapshot, gauge: Callable, counter: Callable, m: list[str]) -> Iterator[Metric]:
    s = host.stats
    yield counter(
        "flashstate:host_cache_states_written", "States written to the host store.", s.states_written
    )
    yield counter("flashstate:host_cache_bytes_written", "Bytes written to the host store.", s.bytes_written)
    yield counter(
        "flashstate:host_cache_writes_skipped",
        "Write-backs dropped (no room, refused by the store, store unavailable).",
        s.writes_skipped,
    )
    yield counter(
        "flashstate:host_cache_writes_refused",
        "Of the dropped write-backs: worth less than the states they would evict, or larger than the tier.",
        s.writes_refused,
    )
    yield counter(
        "flashstate:host_cache_writes_without_buffer",
        "Of the dropped write-backs: admitted, but the store had no free range for their objects.",
        s.writes_without_buffer,
    )
    yield counter("flashstate:host_cache_restores", "States restored from the host tier.", s.restores)
    yield counter(
        "flashstate:host_cache_restored_tokens",
        "Prompt tokens restored from the host tier.",
        s.restored_tokens,
    )
    yield counter(
        "flashstate:host_cache_prefetches",
        "Queued requests' host hits read ahead while they waited (--host-prefetch).",
        s.prefetches,
    )
    yield counter(
        "flashstate:host_cache_prefetches_used",
        "Of the read-aheads: taken over by the request's restore (the rest: admitted otherwise, or aborted).",
        s.prefetches_used,
    )
    yield counter(
        "flashstate:host_cache_shared_tokens",
        "Of the restored tokens, those whose KV was still on the GPU (shared, not copied).",
        s.shared_tokens,
    )
    yield counter(
        "flashstate:host_cache_remote_hits",
        "Host hits on states another engine wrote to the shared store.",
        s.remote_hits,
    )
    yield counter(
        "flashstate:host_cache_remote_restores",
        "States restored that another engine wrote to the shared store (cross-replica restores).",
        s.remote_restores,
    )
    yield counter(
        "flashstate:host_cache_remote_restored_tokens",
        "Of the restored tokens, those of states another engine wrote.",
        s.remote_restored_tokens,
    )
    misses = CounterMetricFamily(
        "flashstate:host_cache_misses",
        "Host states found unusable at restore, by reason (dropped by the store, corrupt, forged: the MAC "
        "does not verify under the deployment secret, layout: not the tensors this engine expects).",
        labels=["model_name", "reason"],
    )
    misses.add_metric([*m, "dropped"], s.misses_dropped)
    misses.add_metric([*m, "corrupt"], s.misses_corrupt)
    misses.add_metric([*m, "forged"], s.misses_forged)
    misses.add_metric([*m, "layout"], s.misses_layout)
    yield misses
    yield counter(
        "flashstate:host_cache_store_refusals",
        "Write-backs the host store refused a put of (no room: the pool full, or a restarted master).",
        s.store_refusals,
    )
    yield counter(
        "flashstate:host_cache_timeouts",
        "Host store calls past their deadline (--host-cache-timeout): a hung or unreachable store.",
        s.timeouts,
    )
    yield counter("flashstate:host_cache_evictions", "Host states evicted by priority.", s.evictions)
    yield counter("flashstate:host_cache_outages", "Times the host store became unreachable.", s.outages)
    yield counter("flashstate:host_cache_reconnects", "Times the host store came back.", s.reconnects)
    yield gauge(
        "flashstate:host_cache_available", "1 while the host store is reachable.", float(host.available)
    )
    yield gauge(
        "flashstate:host_cache_used_bytes", "Bytes of the states the host tier holds.", host.used_bytes
    )
    yield gauge("flashstate:host_cache_states", "States the host tier holds.", host.num_states)
    engine = CounterMetricFamily(
        "flashstate:host_cache_engine_seconds",
        "Engine-thread seconds inside the host tier, by call (lookup, start_restore, load, write_back).",
        labels=["model_name", "call"],
    )
    for call, seconds in sorted(s.engine_seconds_by_call.items()):
        engine.add_metric([*m, call], seconds)
    yield engine
