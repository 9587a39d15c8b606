import json
from pathlib import Path

import pytest

from flashstate.bench.step_summary import STEP_FIELDS
from flashstate.cli import main
from flashstate.sim.fit import fit_noise, fit_steps, holding_step, read_steps
from flashstate.sim.profile import DEFAULT_PROFILE, PROFILES_DIR, ProfileError, load_profile

from .helpers import growing, run

# a step model with every term non-zero, unlike the shipped one's per_token_s and step_s
MODEL = {
    "decode": {"base_s": 0.004, "per_seq_s": 3e-4, "per_token_s": 2e-9},
    "prefill": {"a": 2e-5, "b": 9e-11, "step_s": 0.05},
}


def _profile(tmp_path) -> str:
    doc = json.loads((PROFILES_DIR / f"{DEFAULT_PROFILE}.json").read_text())
    doc.update(MODEL, name="test")
    path = tmp_path / "model.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _timed_by(tmp_path, key: str, section: dict, agents: int, turns: int, step: int, out: int) -> list:
    """The engines of a simulated run (step by step) on the test model with the profile section `key`."""
    doc = json.loads(Path(_profile(tmp_path)).read_text())
    doc[key] = section
    path = tmp_path / f"{key}.json"
    path.write_text(json.dumps(doc))
    sessions = [
        growing(f"s{i}", turns=turns, first=3000 + 500 * i, step=step, out=out, think=0.3)
        for i in range(agents)
    ]
    _, engines = run(sessions, "flashstate", ["--max-num-batched-tokens", "2048"], decode_runs=False,
                     profile=str(path), agents=agents)  # fmt: skip
    return engines


def _sim_rows(tmp_path) -> list[dict]:
    sessions = [
        growing(f"s{i}", turns=4, first=3000 + 500 * i, step=2000, out=60, think=0.3) for i in range(4)
    ]
    _, engines = run(sessions, "flashstate", ["--max-num-batched-tokens", "2048"], decode_runs=False,
                     profile=_profile(tmp_path), agents=4)  # fmt: skip
    return [dict(zip(STEP_FIELDS, r, strict=True)) for r in engines[0].step_rows]


def test_the_fit_recovers_the_model_that_timed_the_steps(tmp_path):
    """The simulator's steps are timed by a known model; fitting its rows (the fields a server's trace has)
    gives that model back."""
    rows = _sim_rows(tmp_path)
    assert any(r["prefill_tokens"] and r["decode_seqs"] for r in rows)  # mixed steps are in the fit
    fit = fit_steps(rows)
    for part in ("decode", "prefill"):
        for key, want in MODEL[part].items():
            assert fit[part][key] == pytest.approx(want, rel=1e-6), (part, key)
    assert fit["fit"]["decode_r2"] == pytest.approx(1.0) and fit["fit"]["prefill_r2"] == pytest.approx(1.0)


def test_fit_profile_writes_a_profile_the_simulator_loads(tmp_path, capsys):
    trace = tmp_path / "steps.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in _sim_rows(tmp_path)))
    out = tmp_path / "mine.json"
    assert main(["fit-profile", str(trace), "--out", str(out)]) == 0
    assert "µs/seq" in capsys.readouterr().out
    p = load_profile(str(out))
    assert p.name == "mine" and p.cache_bytes == load_profile().cache_bytes
    assert p.decode.per_token_s == pytest.approx(MODEL["decode"]["per_token_s"], rel=1e-6)
    assert p.prefill.b == pytest.approx(MODEL["prefill"]["b"], rel=1e-6)
    assert p.prefill_step_s == pytest.approx(MODEL["prefill"]["step_s"], rel=1e-6)
    assert "steps.jsonl" in p.provenance


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"ms": 1.0, "prefill_tokens": 0, "decode_seqs": 1}\n', "without prefill_pairs, decode_context"),
        ("not json\n", "steps.jsonl:1: not a JSON line"),
        ("", "too few steps to fit"),
        (None, "missing.jsonl: No such file"),
    ],
)
def test_bad_traces_are_one_line_errors(tmp_path, capsys, content, message):
    trace = tmp_path / ("steps.jsonl" if content is not None else "missing.jsonl")
    if content is not None:
        trace.write_text(content)
    assert main(["fit-profile", str(trace), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "p.json").exists()


def test_graphed_and_eager_steps_get_their_own_fixed_costs(tmp_path):
    """With mixed-step graphs (the profile prices them), the simulator's rows say which steps were graphed,
    as the server's trace does, and the fit gives both fixed costs back."""
    doc = json.loads(Path(_profile(tmp_path)).read_text())
    doc["prefill"]["graphed_step_s"] = 0.01
    path = tmp_path / "graphed.json"
    path.write_text(json.dumps(doc))
    shape = dict(turns=4, step=300, out=40, think=0.3)
    sessions = [growing(f"s{i}", first=1500 + 700 * i, **shape) for i in range(3)]
    _, engines = run(sessions, "flashstate", ["--max-num-batched-tokens", "4096"], decode_runs=False,
                     profile=str(path), agents=4)  # fmt: skip
    rows = [dict(zip(STEP_FIELDS, r, strict=True)) for r in engines[0].step_rows]
    prefill = [r for r in rows if r["prefill_tokens"]]
    assert any(r["graphed"] for r in prefill) and not all(r["graphed"] for r in prefill)
    fit = fit_steps(rows)
    assert fit["prefill"]["graphed_step_s"] == pytest.approx(0.01, rel=1e-6)
    assert fit["prefill"]["step_s"] == pytest.approx(MODEL["prefill"]["step_s"], rel=1e-6)
    assert fit["fit"]["prefill_graphed_steps"] == sum(r["graphed"] for r in prefill)


def test_the_host_tiers_calls_are_taken_out_of_the_steps(tmp_path):
    """A host-tier server's trace gives each step the engine thread's time inside the tier's calls
    (`host_ms`); the fit prices the steps without it (the simulator charges each call) and says so."""
    rows = _sim_rows(tmp_path)
    traced = [r | {"ms": r["ms"] + 7.5 * (i % 3), "host_ms": 7.5 * (i % 3)} for i, r in enumerate(rows)]
    fit = fit_steps(traced)
    for part in ("decode", "prefill"):
        for key, want in MODEL[part].items():
            assert fit[part][key] == pytest.approx(want, rel=1e-6), (part, key)
    trace = tmp_path / "steps.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in traced))
    assert main(["fit-profile", str(trace), "--out", str(tmp_path / "p.json")]) == 0
    fitted = load_profile(str(tmp_path / "p.json"))
    assert not fitted.host_calls_in_steps
    assert fitted.host_calls == load_profile().host_calls  # what the calls cost: the base profile's


def _with_loop_time(rows: list[dict], busy_ms, idle_ms: float) -> list[dict]:
    """`rows` re-timed as a server's trace: after a row that left requests running or waiting, the engine loop
    takes busy_ms(i) before the next step; after one that left none, it idles idle_ms."""
    out, t = [], rows[0]["t"]
    for i, r in enumerate(rows):
        if i:
            prev = rows[i - 1]
            t += prev["ms"] / 1e3 + (busy_ms(i) if prev["running"] + prev["waiting"] else idle_ms) / 1e3
        out.append(r | {"t": t})
    return out


def test_the_engine_loops_time_between_steps_is_the_steps(tmp_path):
    """The simulator runs steps back to back; a server's engine loop delivers outputs and adds arrivals
    between them. The fit charges that time to the step after it, unless the loop had nothing to do (an idle
    wait is no step's); where it is the host tier's look-ups (in the next row's `host_ms`), it comes out with
    them."""
    rows = _sim_rows(tmp_path)
    assert any(not (r["running"] + r["waiting"]) for r in rows[:-1])  # the trace has idle waits to skip
    loop = lambda i: 0.4 + 1.2 * (i % 3)  # noqa: E731
    trace = tmp_path / "steps.jsonl"
    timed = _with_loop_time(rows, loop, idle_ms=250.0)
    trace.write_text("".join(json.dumps(r) + "\n" for r in timed))
    read = read_steps([trace])
    busy = [bool(i) and bool(rows[i - 1]["running"] + rows[i - 1]["waiting"]) for i in range(len(rows))]
    gaps = [loop(i) if b else 0.0 for i, b in enumerate(busy)]
    assert [r["gap_ms"] for r in read] == pytest.approx(gaps)
    spans = [r | {"ms": r["ms"] + g} for r, g in zip(rows, gaps, strict=True)]
    got, want = fit_steps(read), fit_steps(spans)
    for part in ("decode", "prefill"):
        assert got[part] == pytest.approx(want[part], rel=1e-9), part
    assert got["decode"]["base_s"] > MODEL["decode"]["base_s"]
    # the same loop time spent in the host tier's calls: taken out with them, the model comes back
    looked_up = [r | {"host_ms": r["gap_ms"]} for r in read]
    fit = fit_steps(looked_up)
    for part in ("decode", "prefill"):
        for key, want in MODEL[part].items():
            assert fit[part][key] == pytest.approx(want, rel=1e-6), (part, key)


def test_the_cost_of_each_admission_and_finish_comes_back(tmp_path):
    """A step costs more for each request it admits and each it finishes. Timed so by a profile's "events",
    the simulator's step trace (its rows and request lines, as `simulate --step-trace` writes them) gives
    those costs back through `fit-profile`, with the rest of the model."""
    engines = _timed_by(tmp_path, "events", {"admit_s": 0.003, "finish_s": 0.0012}, 4, 4, 2000, 60)
    rows = [dict(zip(STEP_FIELDS, r, strict=True)) for r in engines[0].step_rows]
    trace = tmp_path / "steps.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in [*rows, *engines[0].request_rows]))
    read = read_steps([trace])
    requests = len(engines[0].request_rows)
    assert sum(r["admitted"] for r in read) == sum(r["finished"] for r in read) == requests
    out = tmp_path / "fitted.json"
    assert main(["fit-profile", str(trace), "--out", str(out)]) == 0
    fitted = load_profile(str(out))
    assert fitted.events.admit_s == pytest.approx(0.003, rel=1e-6)
    assert fitted.events.finish_s == pytest.approx(0.0012, rel=1e-6)
    assert fitted.decode.base_s == pytest.approx(MODEL["decode"]["base_s"], rel=1e-6)
    assert fitted.prefill_step_s == pytest.approx(MODEL["prefill"]["step_s"], rel=1e-6)


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ({"admit": 0.001}, r"events: unknown field\(s\) admit"),
        ({"finish_s": -1}, "events.finish_s: expected"),
    ],
)
def test_a_bad_events_section_is_named(tmp_path, events, message):
    doc = json.loads(Path(_profile(tmp_path)).read_text()) | {"events": events}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=message):
        load_profile(str(path))


def test_the_steps_noise_comes_back(tmp_path):
    """Steps timed by a known model with a known spread around it (the profile's "noise"): fit_noise on their
    rows, priced by the model without the noise, gives the spread back; fit-profile writes it."""
    engines = _timed_by(tmp_path, "noise", {"prefill_sd": 0.1, "decode_sd": 0.2}, 6, 6, 1500, 80)
    rows = [dict(zip(STEP_FIELDS, r, strict=True)) for r in engines[0].step_rows]
    noise = fit_noise(load_profile(_profile(tmp_path)), rows)
    assert noise["prefill_sd"] == pytest.approx(0.1, rel=0.25)
    assert noise["decode_sd"] == pytest.approx(0.2, rel=0.25)
    # fitted with the step model: the model comes back close, and the spread around it
    trace = tmp_path / "steps.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["fit-profile", str(trace), "--out", str(tmp_path / "fitted.json")]) == 0
    fitted = load_profile(str(tmp_path / "fitted.json")).noise
    assert fitted.decode_sd == pytest.approx(0.2, rel=0.25) and fitted.prefill_sd > 0


def test_a_time_is_held_by_the_step_whose_call_spans_it_and_by_none_in_the_loop_between():
    rows = [{"t": 1.0, "ms": 100.0}, {"t": 1.2, "ms": 50.0}]  # calls [1.0, 1.1] and [1.2, 1.25]
    starts = [r["t"] for r in rows]
    assert [holding_step(rows, starts, t) for t in (0.9, 1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3)] == [
        -1, 0, 0, 0, -1, 1, 1, -1,
    ]
    assert holding_step(rows, starts, 1.101, slack=0.002) == 0  # a stamp rounded past the call's end
    assert holding_step(rows, starts, 0.999, slack=0.002) == 0
