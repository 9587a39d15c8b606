"""The `flashstate bench` flags (argparse only: building the parser imports nothing heavy).

    flashstate bench run --url http://127.0.0.1:8000 --agents 8 --duration 300
    flashstate bench compare --policies flashstate,vllm --serve-args "--kv-cache-memory-bytes 64M" \\
        --length-scale 0.02 --time-scale 0.05 --agents 4 --duration 60 --out benchmarks/demo
    flashstate bench stats ../shared/traces/claude-code
"""

from __future__ import annotations

import argparse

from flashstate.bench.config import MODES, ReplayConfig
from flashstate.bench.cost import Prices
from flashstate.bench.workloads import TRACE_SPLITS
from flashstate.config import CACHE_POLICIES


def workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument(
        "--workload",
        default="synthetic",
        help="'synthetic' (the generator fitted to Claude-Code traces) or a trace file/directory",
    )
    g.add_argument(
        "--trace-format",
        default="auto",
        choices=["auto", "agentx", "mooncake"],
        help="trace format (auto: .jsonl is Mooncake, .json/.json.gz AgentX)",
    )
    g.add_argument(
        "--trace-block-size",
        type=int,
        default=None,
        help="tokens per hash block of a Mooncake trace (default 512; AgentX files carry theirs)",
    )
    g.add_argument("--trace-limit", type=int, default=None, help="load at most this many trace files")
    g.add_argument(
        "--trace-split",
        default=None,
        choices=TRACE_SPLITS,
        help="one half of the trace set by a fixed rule: tune = sessions at even positions (sorted by file "
        "name), validate = odd; set knobs on one, report the other",
    )
    g.add_argument(
        "--subagent-prob",
        type=float,
        default=None,
        help="synthetic: probability of a sub-agent group after a turn (default: fitted, 0.07%%)",
    )
    g.add_argument("--seed", type=int, default=0, help="prompt content, session order and synthetic draws")


def replay_args(p: argparse.ArgumentParser) -> None:
    d = ReplayConfig()
    g = p.add_argument_group("replay")
    g.add_argument("--agents", type=int, default=8, help="concurrent agent lanes")
    g.add_argument("--warmup", type=float, default=30.0, help="seconds before the measured window")
    g.add_argument("--duration", type=float, default=300.0, help="seconds measured")
    g.add_argument(
        "--ramp", type=float, default=None, help="lane start stagger in seconds (default: --warmup)"
    )
    g.add_argument("--max-requests", type=int, default=d.max_requests, help="stop after this many requests")
    g.add_argument(
        "--max-sessions",
        type=int,
        default=None,
        help="draw this many sessions; the run ends when they finish",
    )
    g.add_argument(
        "--drain", type=float, default=d.drain_s, help="seconds in-flight requests get after the end"
    )
    g.add_argument(
        "--retries",
        type=int,
        default=d.retries,
        help="send a request again this often when a replica behind a router died under it (a stream cut "
        "before [DONE], a transport error, 502-504); the failed attempts count as errors",
    )
    g.add_argument(
        "--mode",
        default=d.mode,
        choices=MODES,
        help="completions: token-id prompts, each turn re-sending the last one's tokens; chat: messages "
        "through /v1/chat/completions, the history re-rendered by the server's chat template "
        "(flashstate/bench/chat.py)",
    )
    g.add_argument(
        "--chat-thinking-share",
        type=float,
        default=d.chat_thinking_share,
        help="chat: share of an answer the trace marks `thinking` that stands for reasoning and is not "
        "re-sent (0: all re-sent)",
    )
    g.add_argument(
        "--no-chat-tools",
        action="store_true",
        help="chat: only system, user and assistant text (no tool definitions, calls or results)",
    )
    g.add_argument("--served-model", default=None, help="model name to send (default: the server's)")
    g.add_argument(
        "--api-key",
        default=None,
        help="the server's API key (default: env OPENAI_API_KEY; compare starts its servers with it)",
    )
    g.add_argument("--temperature", type=float, default=d.temperature)
    g.add_argument("--request-timeout", type=float, default=d.request_timeout_s, help="seconds per request")
    g.add_argument("--num-gpus", type=int, default=d.num_gpus, help="GPUs behind the server (per-GPU rates)")
    g.add_argument(
        "--max-token-id",
        type=int,
        default=d.max_token_id,
        help="prompt token ids are drawn below this (default: the embedded tokenizer's regular ids)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = p.add_argument_group("scale (recorded in the report)")
    s.add_argument(
        "--length-scale",
        default="1.0",
        help="multiply trace token lengths (blocks, in, out); 'auto': fit 90%% of sessions in --max-context",
    )
    s.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="prompt + output limit; a session ends before a longer prompt (default: the server's)",
    )
    s.add_argument("--time-scale", type=float, default=1.0, help="multiply think times")
    s.add_argument("--max-think-time", type=float, default=None, help="cap one think time (seconds, scaled)")
    s.add_argument("--max-output-tokens", type=int, default=None, help="cap max_tokens of a request")


def cost_args(p: argparse.ArgumentParser) -> None:
    d = Prices()
    g = p.add_argument_group("cost view (defaults: see flashstate/bench/cost.py)")
    g.add_argument("--gpu-price-per-hour", type=float, default=d.gpu_per_hour, help="$ per GPU-hour")
    g.add_argument("--price-input", type=float, default=d.input_per_m, help="$ per M uncached input tokens")
    g.add_argument(
        "--price-cached-input", type=float, default=d.cached_input_per_m, help="$ per M cached input tokens"
    )
    g.add_argument("--price-output", type=float, default=d.output_per_m, help="$ per M output tokens")


def compare_args(cmp: argparse.ArgumentParser) -> None:
    cmp.add_argument(
        "--policies", default="flashstate,vllm", help=f"comma-separated, from {', '.join(CACHE_POLICIES)}"
    )
    cmp.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'NAME=POLICY [FLAGS]'",
        help="one more server, named NAME, with cache policy POLICY and its own serve flags "
        "(repeatable), e.g. --variant 'asc-only=flashstate --prefix-cache-eviction lru'",
    )
    cmp.add_argument("--reference", default=None, help="run the ratios are against (default: vllm or last)")
    cmp.add_argument("--model", default=None, help="model directory for the servers (default: embedded tiny)")
    cmp.add_argument("--serve-args", default="", help="more `flashstate serve` flags, one quoted string")
    cmp.add_argument("--server-timeout", type=float, default=600.0, help="seconds for a server to start")


# The README's main command: a short CPU compare on the embedded model and the synthetic workload, with
# a KV + state budget below the agents' working set (tiny model: 512 B of KV per token, 57 KiB per
# state; 8M leaves ~10k tokens of KV beside 16 working states, while 4 agents at length scale 0.02
# hold ~3k-token contexts each plus their sub-agents'). Three rounds of 20 s, the order reversed each
# round: on a busy laptop the load falls on both servers alike, and the spread says what is noise.
DEMO_DEFAULTS = {
    "bench_command": "compare",
    "policies": "flashstate,vllm",
    "agents": 4,
    "warmup": 10.0,
    "duration": 20.0,
    "rounds": 3,
    "length_scale": "0.02",
    "time_scale": 0.02,
    "max_think_time": 5.0,
    "serve_args": "--device cpu --max-num-seqs 16 --kv-cache-memory-bytes 8M",
}


def rounds_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every server this many times, the order reversed each round (A B, B A, ...), so machine "
        "load falls on all alike; the report gives each metric's median and its spread over the rounds",
    )


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo",
        help="short CPU compare of cache policies on the embedded model (the README's main command)",
        description="`bench compare` with demo defaults: "
        + ", ".join(f"{k.replace('_', '-')}={v}" for k, v in DEMO_DEFAULTS.items() if k != "bench_command"),
    )
    compare_args(demo)
    rounds_arg(demo)
    workload_args(demo)
    replay_args(demo)
    cost_args(demo)
    demo.add_argument("--out", default=None, help="output directory (default: bench-results/<UTC time>)")
    demo.set_defaults(**DEMO_DEFAULTS)


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="agentic replay benchmark (run, compare policies, trace stats)")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    run = bsub.add_parser("run", help="replay agents against a running server")
    run.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    run.add_argument("--label", default="run", help="name of this run in the report")
    cmp = bsub.add_parser("compare", help="one fresh server per cache policy, same workload, one report")
    compare_args(cmp)
    rounds_arg(cmp)
    for p in (run, cmp):
        workload_args(p)
        replay_args(p)
        cost_args(p)
        p.add_argument("--out", default=None, help="output directory (default: bench-results/<UTC time>)")
    report = bsub.add_parser(
        "report", help="one report (tables, compare.json, plots) over result files of separate runs"
    )
    report.add_argument(
        "results", nargs="+", help="result-<label>.json files (or .json.gz), or directories holding them"
    )
    report.add_argument(
        "--whole-run",
        action="store_true",
        help="read every run over its whole length (first send to the drain's end, warm-up included), "
        "not its measured window: for runs whose window holds too few answered requests",
    )
    report.add_argument("--reference", help="run the ratios are against (default: vllm, else the last)")
    report.add_argument("--title", default="flashstate bench report")
    report.add_argument("--out", required=True, help="output directory")
    stats = bsub.add_parser("stats", help="a trace set's statistics and the synthetic generator fitted to it")
    stats.add_argument("path", help="trace file or directory")
    stats.add_argument("--trace-format", default="auto", choices=["auto", "agentx", "mooncake"])
    stats.add_argument("--trace-block-size", type=int, default=None)
    stats.add_argument("--trace-limit", type=int, default=None)
