import dataclasses
import math

import pytest

from flashstate.sampling_params import SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, None, 0.0)
    assert (p.seed, p.max_tokens, p.stop, p.stop_token_ids) == (None, 16, (), ())
    assert (p.ignore_eos, p.logprobs, p.include_stop_str_in_output, p.skip_special_tokens) == (
        False,
        None,
        False,
        True,
    )
    assert not p.greedy


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().temperature = 0.5


@pytest.mark.parametrize("t, greedy", [(0.0, True), (0, True), (1e-6, True), (1e-5, False), (0.7, False)])
def test_greedy(t, greedy):
    assert SamplingParams(temperature=t).greedy is greedy


@pytest.mark.parametrize("off", [None, -1, 0])
def test_top_k_off_values_normalise_to_none(off):
    assert SamplingParams(top_k=off).top_k is None


def test_top_k_positive_kept():
    assert SamplingParams(top_k=40).top_k == 40


def test_stop_normalised_to_tuple():
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")
    assert SamplingParams(stop=("a",)).stop == ("a",)
    assert SamplingParams(stop=[]).stop == ()
    assert SamplingParams(stop_token_ids=[3, 7]).stop_token_ids == (3, 7)
    assert SamplingParams(stop=["a", "bcd"]).max_stop_len == 3
    assert SamplingParams().max_stop_len == 0


def test_max_tokens_none_means_unlimited():
    assert SamplingParams(max_tokens=None).max_tokens is None


def test_params_hashable_and_equal_after_normalisation():
    assert SamplingParams(stop="x", top_k=-1) == SamplingParams(stop=["x"], top_k=None)
    assert hash(SamplingParams(stop="x")) == hash(SamplingParams(stop=("x",)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be an int in [1, 128], got 0"),
        ({"n": 129}, "n must be an int in [1, 128]"),
        ({"temperature": -0.1}, "temperature must be a number >= 0, got -0.1"),
        ({"temperature": math.nan}, "temperature must be a number >= 0, got nan"),
        ({"temperature": "1"}, "temperature must be a number >= 0, got '1'"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"top_p": -0.2}, "top_p must be in (0, 1], got -0.2"),
        ({"top_k": -2}, "top_k must be None, -1, 0 (all off) or a positive int, got -2"),
        ({"top_k": 2.5}, "top_k must be None, -1, 0 (all off) or a positive int, got 2.5"),
        ({"top_k": True}, "top_k must be None, -1, 0 (all off) or a positive int, got True"),
        ({"min_p": -0.1}, "min_p must be in [0, 1], got -0.1"),
        ({"min_p": 1.1}, "min_p must be in [0, 1], got 1.1"),
        ({"seed": 1.5}, "seed must be an int in [-2**63, 2**64) or None, got 1.5"),
        ({"seed": "7"}, "seed must be an int in [-2**63, 2**64) or None, got '7'"),
        ({"max_tokens": 0}, "max_tokens must be an int >= 1 or None, got 0"),
        ({"max_tokens": -5}, "max_tokens must be an int >= 1 or None, got -5"),
        ({"max_tokens": 2.0}, "max_tokens must be an int >= 1 or None, got 2.0"),
        ({"stop": 5}, "stop must be a string or list of strings, got 5"),
        ({"stop": [1, 2]}, "stop must be a string or list of strings, got [1, 2]"),
        ({"stop": ["a", None]}, "stop must be a string or list of strings, got ['a', None]"),
        ({"stop": ["a", ""]}, "stop strings must be non-empty, got ['a', '']"),
        ({"stop": ""}, "stop strings must be non-empty"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids must be a list of non-negative ints, got [1, '2']"),
        ({"stop_token_ids": 3}, "stop_token_ids must be a list of non-negative ints, got 3"),
        ({"stop_token_ids": [-1]}, "stop_token_ids must be a list of non-negative ints, got [-1]"),
        ({"logprobs": -1}, "logprobs must be an int >= 0 or None, got -1"),
        ({"logprobs": 1.0}, "logprobs must be an int >= 0 or None, got 1.0"),
        ({"ignore_eos": 1}, "ignore_eos must be a bool, got 1"),
        ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output must be a bool, got 'yes'"),
        ({"skip_special_tokens": None}, "skip_special_tokens must be a bool, got None"),
        ({"temperature": math.inf}, "temperature must be a number >= 0, got inf"),
        ({"temperature": 10**400}, "temperature must be a number >= 0"),
        ({"top_p": 10**400}, "top_p must be in (0, 1]"),
        ({"seed": 2**64}, "seed must be an int in [-2**63, 2**64) or None"),
        ({"seed": -(2**63) - 1}, "seed must be an int in [-2**63, 2**64) or None"),
        ({"stop": ["x"] * 65}, "stop may hold at most 64 strings, got 65"),
        ({"stop": "x" * 1025}, "stop strings may be at most 1024 characters long"),
        ({"stop_token_ids": [1] * 1025}, "stop_token_ids may hold at most 1024 ids, got 1025"),
    ],
)
def test_validation_errors(kwargs, message):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0},
        {"top_p": 1},
        {"top_p": 1e-3},
        {"min_p": 0},
        {"min_p": 1},
        {"seed": 0},
        {"logprobs": 0},
    ],
)
def test_boundary_values_accepted(kwargs):
    SamplingParams(**kwargs)
