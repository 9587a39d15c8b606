"""`flashstate serve` flags: each lands in EngineConfig, bad values are one-line errors, --help covers all."""

import argparse
import dataclasses

import pytest

from flashstate.args import human_readable_int
from flashstate.cli import _parser, _resolve, main
from flashstate.config import EngineConfig


def config(*argv: str) -> EngineConfig:
    return _resolve(_parser().parse_args(["serve", *argv]))


def test_no_model_means_the_embedded_default(monkeypatch):
    monkeypatch.delenv("FLASHSTATE_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    c = config()
    assert c.model is None and c.host == "127.0.0.1" and c.api_key is None


def test_vllm_style_command_line_lands_in_engine_config():
    c = config(
        "/models/qwen3-next",
        "--host", "0.0.0.0",
        "--port", "9001",
        "--served-model-name", "qwen",
        "--api-key", "sk-1",
        "--max-model-len", "32k",
        "--max-num-seqs", "48",
        "--max-num-batched-tokens", "8K",
        "--gpu-memory-utilization", "0.85",
        "--kv-cache-memory-bytes", "8Gi",
        "--no-enable-prefix-caching",
        "--tensor-parallel-size", "1",
        "--dtype", "half",
        "--seed", "3",
    )  # fmt: skip
    assert (c.model, c.host, c.port, c.served_model_name, c.api_key) == (
        "/models/qwen3-next", "0.0.0.0", 9001, "qwen", ("sk-1",),
    )  # fmt: skip
    assert (c.max_model_len, c.max_num_seqs, c.max_num_batched_tokens) == (32000, 48, 8192)
    assert c.gpu_memory_utilization == 0.85 and c.kv_cache_memory_bytes == 8 << 30
    assert not c.enable_prefix_caching and not c.prefix_caching
    assert (c.tensor_parallel_size, c.dtype, c.seed) == (1, "float16", 3)


def test_cache_and_host_tier_flags_land_in_engine_config():
    c = config(
        "--cache-policy", "sglang",
        "--no-mamba-frontier-checkpoint",
        "--no-mamba-prefill-export",
        "--prefix-cache-eviction", "lru",
        "--prefill-cost-coefficients", "2e-5", "3e-10",
        "--no-prefix-cache-leaf-last",
        "--prefix-cache-leaf-idle-seconds", "12.5",
        "--mamba-block-size", "1152",
        "--host-cache", "mooncake",
        "--host-cache-bytes", "64G",
        "--mooncake-master", "127.0.0.1:50051",
        "--max-waiting-requests", "7",
    )  # fmt: skip
    assert c.cache_policy == "sglang" and not c.mamba_frontier_checkpoint and not c.mamba_prefill_export
    assert c.prefix_cache_eviction == "lru" and c.prefill_cost_coefficients == (2e-5, 3e-10)
    assert not c.prefix_cache_leaf_last and c.prefix_cache_leaf_idle_seconds == 12.5
    assert c.mamba_block_size == 1152 and c.max_waiting_requests == 7
    assert (c.host_cache, c.host_cache_bytes, c.mooncake_master) == ("mooncake", 64 << 30, "127.0.0.1:50051")


def test_every_engine_config_field_has_a_flag_with_help():
    parser = _parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001 — argparse has no API
    actions = {a.dest: a for a in serve._actions}  # noqa: SLF001
    for field in dataclasses.fields(EngineConfig):
        assert field.name in actions, f"no flag sets EngineConfig.{field.name}"
    for action in serve._actions:  # noqa: SLF001
        assert action.help, f"{action.option_strings or action.dest} has no --help text"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tensor-parallel-size", "0"], "tensor_parallel_size must be >= 1"),
        (["--host-cache-bytes", "1G", "--cache-policy", "none"], "needs prefix caching on"),
        (["--host-cache", "memory", "--cache-policy", "vllm"], "not part of the vllm policy"),
        (["--cache-policy", "vllm", "--prefix-cache-eviction", "gds"], "evicts as vLLM does"),
        (["--host-cache", "mooncake"], "needs mooncake_master HOST:PORT"),
        (["--host-cache", "mooncake", "--mooncake-master", "localhost"], "HOST:PORT"),
        (["--mooncake-master", "h:1"], "mooncake_master needs host_cache='mooncake'"),
        (["--prefill-cost-coefficients", "-1", "0"], "non-negative"),
        (["--max-waiting-requests", "0"], "max_waiting_requests must be >= 1"),
        (["--host-chunk-tokens", "0"], "host_chunk_tokens must be >= 1"),
        (["--host-prefetch"], "host_prefetch reads ahead"),  # no host tier
        (
            ["--host-cache-bytes", "1G", "--no-host-inline-fetch", "--host-prefetch"],
            "needs host_cache 'memory'",
        ),
        (["--gil-switch-interval-ms", "0"], "gil_switch_interval_ms must be in (0, 1000]"),
        (["--port", "70000"], "port must be in"),
        (["a", "--model", "b"], "two models given"),
    ],
)
def test_bad_values_are_one_line_errors(capsys, argv, message):
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("flashstate: error: ") and message in err


def test_argparse_rejects_malformed_values(capsys):
    for argv in (
        ["--prefill-cost-coefficients", "1"],
        ["--cache-policy", "lfu"],
        ["--max-model-len", "lots"],
    ):
        with pytest.raises(SystemExit) as e:
            _parser().parse_args(["serve", *argv])
        assert e.value.code == 2
    capsys.readouterr()


def test_help_documents_serve(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--enable-prefix-caching, --no-enable-prefix-caching", "--prefill-cost-coefficients A B",
                 "--mooncake-master HOST:PORT", "--max-waiting-requests"):  # fmt: skip
        assert flag in out


@pytest.mark.parametrize(
    ("text", "value"),
    [("2048", 2048), ("32k", 32000), ("32K", 32768), ("32Ki", 32768), ("1.5G", 3 << 29), ("2m", 2_000_000)],
)
def test_human_readable_int(text, value):
    assert human_readable_int(text) == value


def test_human_readable_int_rejects_junk():
    for text in ("", "-1", "1.5", "k", "3x"):
        with pytest.raises(argparse.ArgumentTypeError):
            human_readable_int(text)


def test_api_key_from_environment(monkeypatch):
    monkeypatch.delenv("FLASHSTATE_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert config().api_key == ("from-env",)
    assert config("--api-key", "flag").api_key == ("flag",)
    assert config("--api-key", "k1", "k2").api_key == ("k1", "k2")


def test_async_scheduling_is_on_by_default_and_can_be_turned_off():
    assert config().async_scheduling is True
    assert config("--no-async-scheduling").async_scheduling is False
    assert config("--async-scheduling").async_scheduling is True
