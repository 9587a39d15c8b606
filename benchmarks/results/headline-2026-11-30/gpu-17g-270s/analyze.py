"""Where the misses are in a headline run: the hit rate against a previous-turn upper bound, and what the
slowest tenth of requests (by TTFT) are.

    python3 analyze.py [run dir]     # default: this script's folder
"""

import json
import statistics
import sys
from pathlib import Path


def window_requests(result: dict) -> list[dict]:
    start = result["replay"]["warmup_s"]
    end = start + result["summary"]["window_s"]
    return [
        r
        for r in result["requests"]
        if not r["error"] and r["ttft"] is not None and start <= r["t_send"] < end
    ]


def previous_turn_bound(result: dict, requests: list[dict]) -> int:
    """Cached tokens if every later turn extended its previous turn's prompt and reply."""
    turns = {(r["session"], r["turn"]): r for r in result["requests"]}
    bound = 0
    for r in requests:
        prev = turns.get((r["session"], r["turn"] - 1))
        if prev is not None:
            bound += min(r["prompt_tokens"] - 1, prev["prompt_tokens"] + prev["output_tokens"])
    return bound


def main() -> None:
    run = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    for policy in ("flashstate", "vllm"):
        result = json.loads((run / f"result-{policy}.json").read_text())
        rq = window_requests(result)
        prompt = sum(r["prompt_tokens"] for r in rq)
        cached = sum(r["cached_tokens"] for r in rq)
        first = [r for r in rq if r["turn"] == 0]
        ttfts = sorted(r["ttft"] for r in rq)
        p90 = ttfts[int(0.9 * len(ttfts))]
        slow = [r for r in rq if r["ttft"] >= p90]
        warm = [r for r in rq if r["cached_tokens"] >= 0.9 * r["prompt_tokens"]]
        warm_ttfts = sorted(r["ttft"] for r in warm)
        missed = [r for r in rq if r["turn"] > 0 and r["cached_tokens"] < 0.5 * r["prompt_tokens"]]
        print(f"{policy}: {len(rq)} requests, hit rate {cached / prompt:.3f}, TTFT p90 {p90:.2f} s")
        first_share = sum(r["prompt_tokens"] for r in first) / prompt
        print(f"  first turns: {len(first)} requests, {first_share:.3f} of the tokens")
        print(f"  previous-turn upper bound on the hit rate: {previous_turn_bound(result, rq) / prompt:.3f}")
        print(
            f"  slowest tenth: {len(slow)} requests, {sum(r['turn'] == 0 for r in slow)} first turns, "
            f"{sum(r['cached_tokens'] < 0.5 * r['prompt_tokens'] for r in slow)} under half cached, "
            f"median uncached {statistics.median(r['prompt_tokens'] - r['cached_tokens'] for r in slow)}"
        )
        print(
            f"  >= 90% cached: {len(warm)} requests, TTFT p50 {statistics.median(warm_ttfts):.3f} s, "
            f"p90 {warm_ttfts[int(0.9 * len(warm_ttfts))]:.3f} s"
        )
        share = sum(r["prompt_tokens"] - r["cached_tokens"] for r in missed) / (prompt - cached)
        print(f"  later turns under half cached: {len(missed)} requests, {share:.3f} of the uncached tokens")


if __name__ == "__main__":
    main()
