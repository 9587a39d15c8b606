"""The flags generated from EngineConfig: one per field not marked internal, with the dataclass's default,
shown in its --help line, and the annotation's choices enforced by argparse."""

import argparse
import dataclasses
import re

import pytest

from flashstate.args import add_cache_args, add_engine_args, add_server_args, config_from_args
from flashstate.config import FIELD_CHOICES, EngineConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flags", exit_on_error=False)
    add_engine_args(p)
    add_cache_args(p)
    add_server_args(p)
    return p


def flag_actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser()._actions if a.dest != "help"}  # noqa: SLF001 — argparse has no API


def test_every_field_is_a_flag_or_marked_internal():
    actions = flag_actions()
    for f in dataclasses.fields(EngineConfig):
        if f.metadata.get("internal"):
            assert f.name not in actions, f"internal EngineConfig.{f.name} has a flag"
        else:
            assert f.name in actions, f"EngineConfig.{f.name} is neither a flag nor marked internal"
            assert f"--{f.name.replace('_', '-')}" in actions[f.name].option_strings
    assert set(actions) <= {f.name for f in dataclasses.fields(EngineConfig)}


def test_every_default_is_the_dataclass_default():
    parsed = parser().parse_args([])
    for f in dataclasses.fields(EngineConfig):
        if not f.metadata.get("internal"):
            assert getattr(parsed, f.name) == f.default, f.name
    assert config_from_args(parsed) == EngineConfig()


def test_every_help_line_shows_its_default():
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    for name, action in flag_actions().items():
        m = re.search(r"\(default: (.+)\)$", action.help)
        assert m, f"--help of {action.option_strings[0]} does not show its default"
        default = fields[name].default
        if fields[name].metadata["shown"] is None and default is not None and not isinstance(default, bool):
            convert = action.type or str
            text = m.group(1)
            shown = tuple(map(convert, text.split())) if isinstance(default, tuple) else convert(text)
            assert shown == default, f"{action.option_strings[0]} shows {m.group(1)}"
    parser().format_help()  # every help string formats (no stray %)


def test_a_literal_field_rejects_a_bad_value_with_argparse_error():
    assert FIELD_CHOICES["cache_policy"] == ("flashstate", "vllm", "sglang", "none")
    for name, values in FIELD_CHOICES.items():
        option = f"--{name.replace('_', '-')}"
        for value in values:
            if value is not None:
                assert getattr(parser().parse_args([option, value]), name) == value
        with pytest.raises(argparse.ArgumentError, match="invalid choice: 'bogus'"):
            parser().parse_args([option, "bogus"])


def test_annotations_give_types_and_aliases_and_negations():
    args = parser().parse_args(
        [
            "--dtype",
            "half",
            "-tp",
            "2",
            "--max-model-len",
            "32K",
            "--no-enable-prefix-caching",
            "--enforce-eager",
        ]
    )
    assert (args.dtype, args.tensor_parallel_size, args.max_model_len) == ("float16", 2, 32768)
    assert args.enable_prefix_caching is False and args.enforce_eager is True
    assert parser().parse_args(["--enforce-eager", "--no-enforce-eager"]).enforce_eager is False
    c = config_from_args(
        parser().parse_args(["--api-key", "a", "b", "--prefill-cost-coefficients", "1", "2"])
    )
    assert c.api_key == ("a", "b") and c.prefill_cost_coefficients == (1.0, 2.0)
    with pytest.raises(argparse.ArgumentError, match="invalid int value"):
        parser().parse_args(["--port", "80.5"])
