"""`flashstate` command line: demo (more subcommands arrive with the server, bench and simulator)."""

from __future__ import annotations

import argparse
import logging
import sys

from flashstate.config import EngineConfig


def _engine_args(p: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    p.add_argument(
        "--model", default=None, help="HF-format model directory (default: the embedded tiny model)"
    )
    p.add_argument(
        "--dtype",
        default=d.dtype,
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weight and activation dtype (auto: the checkpoint's)",
    )
    p.add_argument("--device", default=d.device, help="auto, cpu or cuda[:N]")
    p.add_argument("--seed", type=int, default=d.seed, help="global random seed")
    p.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output, in tokens")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="most requests running at once")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=d.max_num_batched_tokens,
        help="token budget of one step (prefill chunks + decodes)",
    )
    p.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
    p.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        default=None,
        help="bytes for KV blocks + state slots (default: from --gpu-memory-utilization)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=d.gpu_memory_utilization,
        help="fraction of GPU memory the engine may use",
    )


def _config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashstate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a few agents' multi-turn sessions on the engine and report")
    _engine_args(demo)
    demo.add_argument("--agents", type=int, default=4, help="concurrent agent sessions")
    demo.add_argument("--turns", type=int, default=4, help="turns per session")
    demo.add_argument("--max-tokens", type=int, default=24, help="output tokens per turn")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        config = _config(args)
    except ValueError as e:
        print(f"flashstate: error: {e}", file=sys.stderr)
        return 2
    if args.command == "demo":
        from flashstate.demo import run_demo
        from flashstate.llm import LLM

        try:
            llm = LLM(**{k: getattr(config, k) for k in config.__slots__})
        except (ValueError, FileNotFoundError) as e:
            print(f"flashstate: error: {e}", file=sys.stderr)
            return 2
        report = run_demo(llm, args.agents, args.turns, args.max_tokens, args.seed)
        for key, value in report.items():
            print(f"{key:>16}: {value:.4g}" if isinstance(value, float) else f"{key:>16}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
