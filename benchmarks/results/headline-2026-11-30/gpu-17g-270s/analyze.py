"""Where the misses are in a headline run: hit rate against a previous-turn upper bound, and what the
slowest tenth of requests (by TTFT) are.  python3 analyze.py [run dir]"""
import json, statistics as st, sys
from pathlib import Path

run = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
for p in ["flashstate", "vllm"]:
    d = json.loads((run / f"result-{p}.json").read_text())
    s = d["summary"]; w = d["replay"]["warmup_s"]; W = s["window_s"]
    rq = [r for r in d["requests"] if not r["error"] and r["ttft"] is not None and w <= r["t_send"] < w + W]
    P = sum(r["prompt_tokens"] for r in rq); C = sum(r["cached_tokens"] for r in rq)
    t0 = [r for r in rq if r["turn"] == 0]
    # upper bound: a turn's prompt extends the previous turn's prompt + output of the same session
    by = {}
    for r in sorted(d["requests"], key=lambda r: r["t_send"]):
        by.setdefault(r["session"], []).append(r)
    ub = 0
    for r in rq:
        prev = [x for x in by[r["session"]] if x["turn"] == r["turn"] - 1]
        if prev:
            ub += min(r["prompt_tokens"] - 1, prev[0]["prompt_tokens"] + prev[0]["output_tokens"])
    tt = sorted(r["ttft"] for r in rq); p90 = tt[int(0.9 * len(tt))]
    slow = [r for r in rq if r["ttft"] >= p90]
    print(p, f"n={len(rq)} hit={C/P:.3f} summary={s['token_hit_rate']:.3f} turn0 reqs={len(t0)} turn0 tokens={sum(r['prompt_tokens'] for r in t0)/P:.3f}"
          f" ub(prev-turn prefix)={ub/P:.3f} p90={p90:.2f}")
    print("   slowest 10%:", len(slow), "turn0:", sum(r["turn"] == 0 for r in slow),
          "uncached median", st.median(r["prompt_tokens"] - r["cached_tokens"] for r in slow),
          "hit<50%:", sum(r["cached_tokens"] < 0.5 * r["prompt_tokens"] for r in slow),
          "ttft median", round(st.median(r["ttft"] for r in slow), 2))
    fast = [r for r in rq if r["cached_tokens"] >= 0.9 * r["prompt_tokens"]]
    print("   requests >=90% cached:", len(fast), "ttft p50/p90", round(st.median(r['ttft'] for r in fast),3), round(sorted(r['ttft'] for r in fast)[int(.9*len(fast))],3))
    miss = [r for r in rq if r["turn"] > 0 and r["cached_tokens"] < 0.5 * r["prompt_tokens"]]
    print("   later-turn requests <50% cached:", len(miss), "tokens", sum(r['prompt_tokens']-r['cached_tokens'] for r in miss)/ (P-C))
