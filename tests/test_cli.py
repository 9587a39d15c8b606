"""The top-level command line: the README's main command and one-line errors."""

import pytest

from flashstate.bench.cli_args import DEMO_DEFAULTS
from flashstate.cli import _parser, main


def test_demo_is_a_short_compare_with_documented_defaults():
    args = _parser().parse_args(["demo"])
    for key, value in DEMO_DEFAULTS.items():
        assert getattr(args, key) == value
    assert "--kv-cache-memory-bytes" in args.serve_args  # a budget below the agents' working set
    override = _parser().parse_args(["demo", "--policies", "flashstate,vllm,sglang,none", "--duration", "5"])
    assert override.policies == "flashstate,vllm,sglang,none" and override.duration == 5.0


def test_bad_flags_give_one_line_errors(capsys):
    assert main(["calibrate", "--model", "/nonexistent/dir"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("flashstate: error:") and "does not exist" in err[0]
    with pytest.raises(SystemExit):
        main(["demo", "--policies"])  # argparse: missing value
