"""benchmarks/engine_loop_gaps.py on recorded card runs: the engine loop's time after a step grows with the
requests that arrived during it, and with their prompt tokens only where the engine has a host tier (its
lookup as a request is queued); the vllm policy's loop costs about the same after every step."""

from .scripts import ROOT, run_script

CHAT = ROOT / "benchmarks/results/card-2026-12-04/chat-17G-flashstate-host"
VLLM = ROOT / "benchmarks/results/card-2026-12-04/validate-1.0-vllm"


def test_the_loop_after_arrivals_costs_per_request_and_per_token_with_a_host_tier():
    done = run_script("engine_loop_gaps.py", str(CHAT), str(VLLM))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {
        r[0]: {k: v for k, v in zip(head, r, strict=True) if k not in ("run", "trace")}
        for r in ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])
    }
    chat, vllm = ({k: float(v) for k, v in rows[run.name].items()} for run in (CHAT, VLLM))
    assert chat["steps"] > 2000 and vllm["steps"] > 1000
    assert chat["after one: mean (ms)"] > 5 * chat["after no arrival: mean (ms)"]
    assert chat["a: per request (ms)"] > 1 and chat["b: per 10k tokens (ms)"] > 0.5
    assert vllm["b: per 10k tokens (ms)"] < 0.1
    assert vllm["after one: mean (ms)"] < 2 * vllm["after no arrival: mean (ms)"]
    assert chat["loop, % of spans"] > 5 * vllm["loop, % of spans"]
