"""sim/recorded.py: a recorded run's `simulate` arguments carry the engine flags and switches its server
command had, and turn off what became a default after the run; a replay sends its turns at the run's times."""

import json
import shlex

import pytest

from flashstate.cli import main
from flashstate.sim.command import engine_config
from flashstate.sim.profile import load_profile
from flashstate.sim.recorded import engine_cost, simulate_argv
from flashstate.sim.replay import session_key

REPLAY = {
    "seed": 0, "agents": 48, "warmup_s": 15.0, "duration_s": 60.0, "drain_s": 10.0, "length_scale": 0.25,
    "max_context": 65536, "time_scale": 0.05, "max_think_s": 5.0, "max_output_tokens": 512,
}  # fmt: skip


def _result(created: str, *serve: str) -> dict:
    command = [
        "python3",
        "-m",
        "flashstate.cli",
        "serve",
        "--max-num-seqs",
        "48",
        "--kernel-cache",
        "/tmp/kc",
    ]
    host = ["--host-cache", "memory", "--host-cache-bytes", "64G"]
    server = {"command": [*command, *host, *serve], "cache_policy": "flashstate", "variant_args": host}
    return {
        "label": "flashstate-host",
        "created": created,
        "replay": REPLAY,
        "server": server,
        "workload": {},
    }


def _config(argv: list[str]):
    serve = shlex.split(argv[argv.index("--serve-args") + 1])
    variant = shlex.split(argv[argv.index("--variant") + 1])[1:]
    return engine_config(load_profile(argv[argv.index("--profile") + 1]), [*serve, *variant], "flashstate")


@pytest.mark.parametrize(
    ("created", "serve", "prefetch", "reserved"),
    [
        ("2026-12-04T20:18:57+00:00", [], False, True),  # before read-aheads; working slots reserved then
        ("2026-12-05T02:16:41+00:00", [], True, True),  # while read-aheads were on by default: with them
        ("2026-12-05T02:14:03+00:00", ["--no-host-prefetch"], False, True),
        ("2026-12-05T10:00:00+00:00", [], False, False),  # both off by default since
        ("2026-12-05T10:00:00+00:00", ["--host-prefetch", "--reserve-working-slots"], True, True),
    ],
)
def test_the_replay_runs_the_engine_the_command_ran(created, serve, prefetch, reserved):
    argv = simulate_argv(_result(created, "--host-chunk-tokens", "4096", *serve), "h200-qwen3-next-2b", "T")
    config = _config(argv)
    assert config.host_prefetch is prefetch and config.host_chunk_tokens == 4096
    assert config.reserve_working_slots is reserved
    assert config.max_num_seqs == 48 and config.host_tier == "memory"
    assert "--kernel-cache" not in argv[argv.index("--serve-args") + 1]  # where it ran, not what it ran


def test_the_replay_prices_the_cache_with_the_engine_s_calibration():
    """Which checkpoints and KV paths an engine keeps depends on its prefill cost C(n): a replay uses the
    coefficients the run's server reported (its calibration), not the profile's."""
    result = _result("2026-12-04T20:18:57+00:00")
    labels = 'model_name="/tmp/fs/models/m",source="cached"'
    result["server_metrics"] = {
        "after": {
            f'flashstate:prefill_cost_coefficient{{{labels},term="a"}}': 7.510875029006147e-06,
            f'flashstate:prefill_cost_coefficient{{{labels},term="b"}}': 1.1671723690957035e-10,
            "flashstate:num_requests_running": 0.0,
        }
    }
    assert engine_cost(result) == (7.510875029006147e-06, 1.1671723690957035e-10)
    config = _config(simulate_argv(result, "h200-qwen3-next-2b-tune", "T"))
    assert config.prefill_cost_coefficients == (7.510875029006147e-06, 1.1671723690957035e-10)
    # a run without the reading (another server's) keeps the profile's
    assert engine_cost(_result("2026-12-04T20:18:57+00:00")) is None
    profile = load_profile("h200-qwen3-next-2b-tune")
    given = profile.engine_args[profile.engine_args.index("--prefill-cost-coefficients") + 1 :][:2]
    config = _config(simulate_argv(_result("2026-12-04T20:18:57+00:00"), "h200-qwen3-next-2b-tune", "T"))
    assert config.prefill_cost_coefficients == tuple(float(x) for x in given)


def test_a_replay_can_send_each_turn_when_the_recorded_run_did(tmp_path):
    """`simulate --send-times RESULT`: each turn is sent when RESULT sent the same session's turn, or when its
    previous turn ends where that is later; the closed loop's think times give way to the record's."""
    argv = ["simulate", "--policies", "vllm", "--agents", "3", "--duration", "120", "--seed", "1"]
    assert main([*argv, "--out", str(tmp_path / "first")]) == 0
    recorded = json.loads((tmp_path / "first" / "result-vllm.json").read_text())
    later = [r for r in recorded["requests"] if r["turn"] > 0]
    moved = later[len(later) // 2]
    moved["t_send"] += 1.0  # this turn sent a second later than the first replay sent it
    (tmp_path / "record.json").write_text(json.dumps(recorded))

    assert main([*argv, "--send-times", str(tmp_path / "record.json"), "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "result-vllm.json").read_text())
    sent = {(session_key(r["session"]), r["turn"]): r["t_send"] for r in recorded["requests"]}
    key = (session_key(moved["session"]), moved["turn"])
    for r in again["requests"]:
        k = (session_key(r["session"]), r["turn"])
        if k in sent:
            assert r["t_send"] >= sent[k] - 1e-9, k
    assert {(session_key(r["session"]), r["turn"]): r["t_send"] for r in again["requests"]}[key] == (
        pytest.approx(moved["t_send"])
    )
