"""The simulator against recorded H200 runs (96 agents, the qwen3-next-2b preset, a budget of half their
working set): benchmarks/results/gpu-overload-2026-12-02 (flashstate then vllm, before the cold reserve; its
flashstate engine is gone, so only its steps are priced)
and gpu-overload-2026-12-03 (flashstate with the cold reserve and mixed-step graphs that take exporting
steps, against the profile fitted from its steps, with the request overhead fitted from the earlier runs);
and chat-vs-token-2026-12-03/token (48 agents, the headline flags, flashstate with its 64G host tier, with
and without fallback checkpoints: the host profile fitted from the first run, checked against the second);
card-2026-12-04 and card-2026-12-05 (48 agents: the validate half at half its working set, on the profile
fitted on the tune half's runs; a real-size model at length scale 1, on a rough profile fitted on an earlier
attempt).

Two levels: the served profile's step model prices the runs' recorded steps (`--step-trace`) within 15% of
their measured time; and (where the Claude-Code traces are at hand) the simulator replaying the same
workload on the same flags lands within 15% of the run's reported figures. On a profile with step noise
(the tune profile) the prediction is the median over sim_error.py's seven noise seeds, and a figure that a
few requests set (TTFT) is checked against the seeds' spread. Recorded data, simulated time: nothing here
depends on this machine's speed."""

from pathlib import Path

import pytest

from flashstate.bench.report import read_result
from flashstate.cli import main
from flashstate.sim.fit import read_steps, step_model_error
from flashstate.sim.profile import NO_STEP_NOISE, load_profile
from flashstate.sim.recorded import METRICS, error, median_summary, simulate_argv

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
RUN = RESULTS / "gpu-overload-2026-12-02"
PROFILE = "h200-qwen3-next-2b-served"
GRAPHED_RUN = RESULTS / "gpu-overload-2026-12-03"
GRAPHED_PROFILE = "h200-qwen3-next-2b-graphed"
HOST_RUN = RESULTS / "chat-vs-token-2026-12-03" / "token"
HOST_PROFILE = "h200-qwen3-next-2b-host"
TUNE_PROFILE = "h200-qwen3-next-2b-tune"
REAL_SIZE_RUN = RESULTS / "card-2026-12-04" / "real-size-0.15"
REAL_SIZE_PROFILE = RESULTS / "card-2026-12-04" / "h200-qwen3.6-35b-a3b-rough.json"  # fitted on earlier runs
STALL_MS = 1000  # steps that compiled a Triton kernel variant inside the step (the server log names them)
TOLERANCE = 0.15
ALL = ("TTFT p50", "TTFT p90", "output TPM", "uncached p50")
SEEDS = range(7)  # noise seeds, as benchmarks/sim_error.py replays


def _assert_close(got: dict, want: dict, *names: str) -> None:
    """Two runs' summaries: hit rate within 5 points, each named metric within TOLERANCE."""
    e = error(got, want)
    assert abs(e["hit rate"]) <= 0.05, e
    for name in names:
        assert abs(e[name]) <= TOLERANCE, (name, e)


@pytest.mark.parametrize("policy, stalls", [("flashstate", 10), ("vllm", 0)])
def test_the_profile_prices_the_recorded_steps_within_15_percent(policy, stalls):
    rows = read_steps([RUN / f"steps-{policy}.jsonl.gz"])
    # the flashstate server was the first on a bare machine: its compiles are not a cost the model prices
    assert sum(r["ms"] >= STALL_MS for r in rows) == stalls
    by_kind = step_model_error(load_profile(PROFILE), [r for r in rows if r["ms"] < STALL_MS])
    for kind, e in by_kind.items():
        if e["steps"] >= 50:  # the vllm run decoded alone only 4 times
            assert abs(e["error"]) <= TOLERANCE, (kind, e)
    assert by_kind["prefill"]["steps"] > 800


def _result(run: Path, label: str = "*") -> dict:
    """A run's bench result, as written or gzipped."""
    return read_result(next(run.glob(f"result-{label}.json*")))


def _simulate(run: Path, profile: str, out: Path, traces, label: str = "*", seed: int | None = None) -> Path:
    """The simulator on a recorded run's workload, trace half, engine flags and policy, under its label (at
    noise seed `seed` where given)."""
    argv = [*simulate_argv(_result(run, label), profile, traces)]
    if seed is not None:
        argv += ["--step-noise-seed", str(seed)]
    assert main([*argv, "--out", str(out)]) == 0
    return out


def _predicted(run: Path, profile: str, out: Path, traces, label: str = "*") -> tuple[dict, list[dict]]:
    """(the prediction, each replay's summary): the median over the noise seeds, or the one replay of a
    profile without noise."""
    seeds = SEEDS if load_profile(profile).noise != NO_STEP_NOISE else [None]
    runs = [
        _result(_simulate(run, profile, out / f"seed{s}", traces, label, s), label)["summary"] for s in seeds
    ]
    return median_summary(runs), runs


def _assert_inside(runs: list[dict], want: dict, *names: str) -> None:
    """Each named figure of the run `want` within TOLERANCE of the span of the replays' (`runs`)."""
    for name in names:
        pick = METRICS[name]
        values = [pick(r) for r in runs]
        assert min(values) * (1 - TOLERANCE) <= pick(want) <= max(values) * (1 + TOLERANCE), (name, values)


@pytest.fixture(scope="module")
def simulated(traces, tmp_path_factory):
    # Only vllm: that flashstate server's cache rules are gone (the cold reserve, which 0 turns off, and
    # the protection a checkpoint kept after a hit, which nothing turns back on); the later runs stand for it.
    out = tmp_path_factory.mktemp("sim")
    return _simulate(RUN, PROFILE, out, traces, "vllm")


@pytest.mark.parametrize("policy", ["vllm"])
def test_the_simulator_reproduces_the_recorded_run(simulated, policy):
    got = _result(simulated, policy)["summary"]
    want = _result(RUN, policy)["summary"]
    _assert_close(got, want, "TTFT p50", "TTFT p90", "output TPM")


def test_the_graphed_profile_prices_its_runs_steps_within_15_percent():
    rows = read_steps([GRAPHED_RUN / "steps-flashstate.jsonl.gz"])
    assert sum(r["graphed"] for r in rows if r["prefill_tokens"]) > 500  # exporting steps ran graphed
    for kind, e in step_model_error(load_profile(GRAPHED_PROFILE), rows).items():
        assert abs(e["error"]) <= TOLERANCE, (kind, e)


def test_the_simulator_reproduces_the_run_with_the_cold_reserve_and_exporting_graphs(traces, tmp_path):
    got = _result(_simulate(GRAPHED_RUN, GRAPHED_PROFILE, tmp_path, traces, "flashstate"))["summary"]
    want = _result(GRAPHED_RUN, "flashstate")["summary"]
    # TTFT p90 is left out: on the card it sits where the 9% cold requests begin (p88 0.30 s, p92 16 s),
    # so a point of cold share moves it by half (simulated 8%: -25%; RESULTS.md)
    _assert_close(got, want, "TTFT p50", "output TPM", "uncached p50")


def test_the_host_profile_reproduces_the_other_host_tier_run(traces, tmp_path):
    """The profile's steps come from the run with fallback checkpoints (the default); the run without them
    is predicted. Hit rate, uncached p50 and throughput land within 15%; TTFT does not (RESULTS.md: p50
    -24%, p90 -58%: in a 60 s window both sit in the start's queue of cold prompts, which the card drains
    slower than the model)."""
    got = _result(_simulate(HOST_RUN, HOST_PROFILE, tmp_path, traces, "flashstate-host-off"))["summary"]
    want = _result(HOST_RUN, "flashstate-host-off")["summary"]
    _assert_close(got, want, "output TPM", "uncached p50")


@pytest.mark.parametrize(
    "fraction, policy, spread",
    [
        ("0.5", "flashstate-host", ("TTFT p50", "TTFT p90")),
        ("0.5", "vllm", ()),
        ("1.0", "flashstate-host", ()),
    ],
)
def test_the_profile_fitted_on_the_tune_half_predicts_the_validate_half(
    traces, tmp_path, fraction, policy, spread
):
    """The card runs at half the working set of the validate half (2026-12-04) and flashstate's at all of it,
    on the profile fitted on the tune half's host-tier runs of 2026-12-03 (steps less the tier's calls, which
    the simulator charges per call): every metric within 15% (RESULTS.md; vllm at all of it is not: it sits on
    its cliff, where five points of hit rate move its median request across the gap), but flashstate's TTFT
    at half of W, which the noise seeds spread over 0.128–0.141 s (p50) and 0.316–0.488 s (p90) against the
    card's 0.112 and 0.283: the median is +21% and +19% (RESULTS.md, "Steps that stray")."""
    run = RESULTS / "card-2026-12-04" / f"validate-{fraction}-{policy}"
    got, runs = _predicted(run, TUNE_PROFILE, tmp_path, traces)
    want = _result(run)["summary"]
    _assert_close(got, want, *(m for m in ALL if m not in spread))
    _assert_inside(runs, want, *spread)


def test_the_rough_real_size_profile_predicts_the_real_size_run(traces, tmp_path):
    """qwen3.6-35b-a3b at length scale 1 and 15% of W (2026-12-04, evening): the rough profile fitted on the
    first real-size attempt's runs predicts the later run. flashstate + host within 15% on TTFT p50/p90,
    throughput and uncached p50; vllm answered one request in the window, so its throughput alone."""
    out = _simulate(REAL_SIZE_RUN, str(REAL_SIZE_PROFILE), tmp_path / "fs", traces, "flashstate-host")
    _assert_close(_result(out)["summary"], _result(REAL_SIZE_RUN, "flashstate-host")["summary"], *ALL)
    out = _simulate(REAL_SIZE_RUN, str(REAL_SIZE_PROFILE), tmp_path / "vllm", traces, "vllm")
    got = _result(out)["summary"]
    tpm, want = got["output_tpm"], _result(REAL_SIZE_RUN, "vllm")["summary"]["output_tpm"]
    assert abs(tpm / want - 1) <= TOLERANCE, (tpm, want)


def test_the_tune_profile_with_chat_costs_predicts_the_chat_run(traces, tmp_path):
    """flashstate + 64G host tier, chat mode, 17G (2026-12-04), on the tune profile whose chat costs (template
    tokens, the engine thread's time per chat prompt token and per chat request admitted) were fitted on the
    chat runs of 2026-12-03, replaying the replies its server did not splice (sim/recorded.py): hit rate,
    uncached p50, throughput and TTFT p50 within 15%; p90 not (RESULTS.md: the noise seeds' median -16%)."""
    run = RESULTS / "card-2026-12-04" / "chat-17G-flashstate-host"
    got, _ = _predicted(run, TUNE_PROFILE, tmp_path, traces)
    _assert_close(got, _result(run)["summary"], "output TPM", "uncached p50", "TTFT p50")


def test_the_tune_profile_predicts_the_validate_half_at_today_s_engine(traces, tmp_path):
    """The validate half at half its working set, twice on one card at f3e6542 (2026-12-05), against the
    profile fitted on the tune half (its host-tier call costs refitted on the tune half's runs of that day):
    hit rate, uncached p50 and throughput within 15% of each run; TTFT p50 and p90, which moved 13% and 41%
    between the two runs, within 15% of the range they span (RESULTS.md, "The validate half at today's
    engine")."""
    runs = [RESULTS / "card-2026-12-05" / f"validate-0.5-{i}" for i in (1, 2)]
    got, _ = _predicted(runs[0], TUNE_PROFILE, tmp_path, traces)
    wants = [_result(run)["summary"] for run in runs]
    for want in wants:
        _assert_close(got, want, "output TPM", "uncached p50")
    for q in ("p50", "p90"):
        low, high = min(w["ttft_s"][q] for w in wants), max(w["ttft_s"][q] for w in wants)
        ttft = got["ttft_s"][q]
        assert low * (1 - TOLERANCE) <= ttft <= high * (1 + TOLERANCE), (q, ttft, low, high)
