"""sim/recorded.py: a recorded run's `simulate` arguments carry the engine flags and switches its server
command had, and turn off what became a default after the run."""

import shlex

import pytest

from flashstate.sim.command import engine_config
from flashstate.sim.profile import load_profile
from flashstate.sim.recorded import simulate_argv

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
    return engine_config(load_profile(None), [*serve, *variant], "flashstate")


@pytest.mark.parametrize(
    ("created", "serve", "prefetch"),
    [
        ("2026-12-04T20:18:57+00:00", [], False),  # before read-aheads
        ("2026-12-05T02:16:41+00:00", [], True),  # while they were on by default: replayed with them
        ("2026-12-05T02:14:03+00:00", ["--no-host-prefetch"], False),
        ("2026-12-05T10:00:00+00:00", [], False),  # off by default since
        ("2026-12-05T10:00:00+00:00", ["--host-prefetch"], True),
    ],
)
def test_the_replay_runs_the_engine_the_command_ran(created, serve, prefetch):
    argv = simulate_argv(_result(created, "--host-chunk-tokens", "4096", *serve), "h200-qwen3-next-2b", "T")
    config = _config(argv)
    assert config.host_prefetch is prefetch and config.host_chunk_tokens == 4096
    assert config.max_num_seqs == 48 and config.host_tier == "memory"
    assert "--kernel-cache" not in argv[argv.index("--serve-args") + 1]  # where it ran, not what it ran
