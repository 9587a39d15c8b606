"""benchmarks/overhead_sharing.py on recorded card runs: a chat run's time outside the engine, beyond the
profile's price for a request alone, follows the prompts prepared beside it sharing one CPU (the model a chat
replay runs) more than a one-at-a-time queue; a token-mode run's hardly follows either."""

from .scripts import ROOT, run_script

CHAT = ROOT / "benchmarks/results/card-2026-12-04/chat-17G-flashstate-host"
TOKENS = ROOT / "benchmarks/results/card-2026-12-05/tune-0.5-plain-1"


def test_a_chat_runs_overhead_follows_the_shared_cpu():
    done = run_script("overhead_sharing.py", str(CHAT), str(TOKENS), "--profile", "h200-qwen3-next-2b-tune")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {
        r[0]: dict(zip(head, r, strict=True))
        for r in ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])
    }
    chat, tokens = rows[CHAT.name], rows[TOKENS.name]
    assert (chat["mode"], tokens["mode"]) == ("chat", "completions")
    assert int(chat["pairs"]) > 500 and int(tokens["pairs"]) > 500
    assert float(chat["shared: correlation"]) > float(chat["queued: correlation"]) > 0.2
    assert float(tokens["shared: correlation"]) < 0.2
    assert float(chat["residual p90 (ms)"]) > 3 * float(tokens["residual p90 (ms)"])
