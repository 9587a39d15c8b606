"""benchmarks/sim_vs_card.py on a recorded card run: the run simulated with its own flags and a step trace,
and the two traces' engine and request figures side by side."""

import numpy as np

from flashstate.bench.step_summary import read_trace

from .scripts import ROOT, run_script

RUN = ROOT / "benchmarks/results/card-2026-12-04/validate-0.5-vllm"


def _script(*args: str):
    return run_script("sim_vs_card.py", *args)


def _cells(table: str) -> dict[str, list[str]]:
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("| ")]
    return {r[0].strip(): [c.strip() for c in r[1:]] for r in rows}


def test_the_card_and_its_simulation_side_by_side(traces, tmp_path):
    done = _script(
        str(RUN), "--profile", "h200-qwen3-next-2b-tune", "--traces", str(traces), "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "vs.md").read_text()
    assert "The profile's step model on the card's steps: decode" in text
    cells = _cells(text)
    card_steps, card_requests = read_trace(RUN / "steps-vllm.jsonl.gz")
    sim_steps, sim_requests = read_trace(tmp_path / "steps-vllm.jsonl.gz")
    assert cells["steps"][:2] == [f"{len(card_steps):,}", f"{len(sim_steps):,}"]
    assert cells["engine loop, % of spans"][1] == "0"  # the simulator runs its steps back to back
    kinds = ("host", "gpu", "cold")
    assert sum(int(cells[f"{k}: requests"][0].replace(",", "")) for k in kinds) == len(card_requests)
    assert sum(int(cells[f"{k}: requests"][1].replace(",", "")) for k in kinds) == len(sim_requests)
    assert cells["host: requests"][:2] == ["0", "0"] and cells["host-tier calls (s)"][:2] == ["–", "0"]
    assert cells["host: read before admission"][:2] == ["0", "0"]
    assert cells["states exported per step with prefill"][1] != "–"  # the simulator's rows count them
    # every continuation both ran resumed somewhere, on each side
    resumed = [k for k in cells if k.startswith("matched continuations: ") and "short" not in k]
    assert len(resumed) == 3
    totals = [sum(int(cells[k][side].replace(",", "")) for k in resumed) for side in (0, 1)]
    assert totals[0] == totals[1] > 0
    short = int(cells["matched continuations: short on the card, at the frontier simulated"][0])
    assert 0 <= short <= totals[0]
    # the card stamps an admission inside its step's scheduling; the wait runs to that step's start
    cold = [r for r in card_requests if 2 * r["cached_tokens"] < r["prompt_tokens"] and r.get("first_token")]
    stamped = float(np.percentile([r["admitted"] - r["arrival"] for r in cold], 50))
    assert 0 < float(cells["cold: admission wait p50 (s)"][0]) < stamped


def test_a_restore_of_a_mostly_new_prompt_counts_as_cold(traces, tmp_path):
    run = ROOT / "benchmarks/results/card-2026-12-06/h100-chat-17G-flashstate-host"
    done = _script(
        str(run), "--profile", "h200-qwen3-next-2b-tune", "--traces", str(traces), "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    cells = _cells((tmp_path / "vs.md").read_text())
    _, requests = read_trace(run / "steps-flashstate-host.jsonl.gz")
    answered = [r for r in requests if r.get("first_token") is not None]
    mostly_new = [r for r in answered if 2 * r["cached_tokens"] < r["prompt_tokens"]]
    restored = [r for r in answered if r.get("fetched") is not None]
    assert any(r in mostly_new for r in restored)  # this run restored some prompts' smaller part
    assert int(cells["cold: requests"][0]) == len(mostly_new)
    assert int(cells["host: requests"][0]) == sum(r not in mostly_new for r in restored)


def test_a_run_without_a_step_trace_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    result = next(RUN.glob("result-vllm.json*"))
    (run / result.name).write_bytes(result.read_bytes())  # the result without its step trace
    done = _script(str(run), "--profile", "x", "--traces", "x", "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and "kept no step trace" in done.stderr
