import math

import pytest
import torch

from flashstate.layers.sampler import Sampler, SamplingBatch, filter_logits
from flashstate.sampling_params import SamplingParams, request_generator


def batch_of(*params: SamplingParams) -> SamplingBatch:
    return SamplingBatch.build([(p, request_generator(p)) for p in params])


def kept(logits: list[float], **kwargs) -> set[int]:
    """Indices that survive the filters for one row."""
    masked = filter_logits(torch.tensor([logits]), batch_of(SamplingParams(**kwargs)))
    return set(torch.isfinite(masked[0]).nonzero().flatten().tolist())


def log(probs: list[float]) -> list[float]:
    return [math.log(p) for p in probs]


# Probabilities 0.4, 0.3, 0.2, 0.1 in scrambled vocab order: index 2 > 0 > 3 > 1.
PROBS = [0.3, 0.1, 0.4, 0.2]


@pytest.mark.parametrize(
    "k, expected", [(1, {2}), (2, {2, 0}), (3, {2, 0, 3}), (4, {0, 1, 2, 3}), (100, {0, 1, 2, 3})]
)
def test_top_k_keeps_exactly_the_k_largest(k, expected):
    assert kept(log(PROBS), top_k=k) == expected


@pytest.mark.parametrize(
    "p, expected", [(0.35, {2}), (0.5, {2, 0}), (0.65, {2, 0}), (0.8, {2, 0, 3}), (0.95, {0, 1, 2, 3})]
)
def test_top_p_keeps_the_shortest_prefix_reaching_p(p, expected):
    assert kept(log(PROBS), top_p=p) == expected


def test_top_p_applies_to_probabilities_renormalised_after_top_k():
    # Without top-k: 0.4 < 0.5, so the 0.3 token stays too.
    assert kept(log(PROBS), top_p=0.5) == {2, 0}
    # After top-k=2 the two survivors weigh 4/7 and 3/7: 4/7 >= 0.5 already.
    assert kept(log(PROBS), top_k=2, top_p=0.5) == {2}


@pytest.mark.parametrize(
    "min_p, expected", [(0.2, {0, 2, 3, 1}), (0.3, {0, 2, 3}), (0.6, {0, 2}), (1.0, {2})]
)
def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability(min_p, expected):
    # Ratios to the top (0.4): 0.75, 0.5, 0.25.
    assert kept(log(PROBS), min_p=min_p) == expected


def test_min_p_sees_temperature_scaled_probabilities():
    # At temperature 2 the ratios become sqrt(0.75, 0.5, 0.25) = 0.87, 0.71, 0.5.
    assert kept(log(PROBS), min_p=0.6) == {0, 2}
    assert kept(log(PROBS), min_p=0.6, temperature=2.0) == {0, 2, 3}


def test_filters_are_per_row():
    logits = torch.tensor([log(PROBS)] * 4)
    batch = batch_of(
        SamplingParams(top_k=1),
        SamplingParams(),
        SamplingParams(top_p=0.65),
        SamplingParams(min_p=0.3),
    )
    finite = torch.isfinite(filter_logits(logits, batch))
    assert [set(r.nonzero().flatten().tolist()) for r in finite] == [{2}, {0, 1, 2, 3}, {0, 2}, {0, 2, 3}]


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 4.0]])
    out = filter_logits(logits, batch_of(SamplingParams(temperature=0.5)))
    torch.testing.assert_close(out, logits * 2)
    out = filter_logits(logits, batch_of(SamplingParams(temperature=0.5, top_k=2, top_p=0.99, min_p=0.01)))
    torch.testing.assert_close(out, torch.tensor([[float("-inf"), 4.0, 8.0]]))


def test_greedy_equals_argmax_and_logprobs_are_raw_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(8, 50)
    out = Sampler()(logits, batch_of(*[SamplingParams(temperature=0.0, top_k=3, logprobs=2)] * 8))
    assert torch.equal(out.token_ids, logits.argmax(-1))
    expected = torch.log_softmax(logits, -1).gather(1, out.token_ids[:, None])[:, 0]
    torch.testing.assert_close(out.logprobs, expected)
    assert out.top_token_ids.shape == (8, 2)
    assert torch.equal(out.top_token_ids[:, 0], out.token_ids)


def test_mixed_batch_greedy_rows_take_argmax():
    torch.manual_seed(1)
    logits = torch.randn(6, 30)
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.5) for i in range(6)]
    for _ in range(10):
        out = Sampler()(logits, batch_of(*params))
        assert torch.equal(out.token_ids[1::2], logits[1::2].argmax(-1))


def test_sampled_logprobs_ignore_temperature_and_filters():
    torch.manual_seed(2)
    logits = torch.randn(16, 40)
    out = Sampler()(logits, batch_of(*[SamplingParams(temperature=0.3, top_k=5, top_p=0.9)] * 16))
    expected = torch.log_softmax(logits, -1).gather(1, out.token_ids[:, None])[:, 0]
    torch.testing.assert_close(out.logprobs, expected)
    assert out.top_token_ids is None and out.top_logprobs is None


def test_top_logprobs_width_is_the_largest_request():
    logits = torch.randn(3, 20)
    batch = batch_of(SamplingParams(logprobs=0), SamplingParams(logprobs=4), SamplingParams())
    out = Sampler()(logits, batch)
    assert out.top_logprobs.shape == (3, 4)
    torch.testing.assert_close(out.top_logprobs, torch.log_softmax(logits, -1).topk(4, dim=-1).values)


def test_samples_only_from_kept_tokens_and_reaches_all_of_them():
    torch.manual_seed(3)
    logits = torch.tensor([log([0.3, 0.1, 0.4, 0.2, 1e-9])] * 4000)
    out = Sampler()(logits, batch_of(*[SamplingParams(top_p=0.8)] * 4000))
    assert set(out.token_ids.tolist()) == {0, 2, 3}


def test_never_samples_minus_inf_logits():
    logits = torch.full((2000, 10), float("-inf"))
    logits[:, 7] = 0.0
    logits[:, 3] = 0.0
    out = Sampler()(logits, batch_of(*[SamplingParams(temperature=5.0)] * 2000))
    assert set(out.token_ids.tolist()) == {3, 7}


def frequencies(token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(token_ids, minlength=vocab).float() / token_ids.numel()


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_sampling_matches_temperature_scaled_softmax(temperature):
    torch.manual_seed(4)
    n = 40_000
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log().expand(n, 3).contiguous()
    out = Sampler()(logits, batch_of(*[SamplingParams(temperature=temperature)] * n))
    expected = torch.softmax(probs.log() / temperature, -1)
    # 4.5 standard deviations of a frequency over n draws.
    tol = 4.5 * (expected * (1 - expected) / n).sqrt()
    assert ((frequencies(out.token_ids, 3) - expected).abs() < tol).all()


def test_temperature_changes_the_distribution_measurably():
    torch.manual_seed(5)
    n = 20_000
    logits = torch.tensor([0.5, 0.3, 0.2]).log().expand(n, 3).contiguous()
    cold = frequencies(Sampler()(logits, batch_of(*[SamplingParams(temperature=0.5)] * n)).token_ids, 3)
    hot = frequencies(Sampler()(logits, batch_of(*[SamplingParams(temperature=2.0)] * n)).token_ids, 3)
    assert cold[0] > 0.6 and hot[0] < 0.45  # exact: 0.66 and 0.41


def test_seeded_row_draws_from_its_own_generator():
    p = SamplingParams(seed=7)
    # Same seed, fresh generators: same draw, regardless of the global RNG.
    torch.manual_seed(0)
    a = Sampler()(torch.zeros(1, 1000), SamplingBatch.build([(p, request_generator(p))])).token_ids
    torch.manual_seed(1)
    b = Sampler()(torch.zeros(1, 1000), SamplingBatch.build([(p, request_generator(p))])).token_ids
    assert torch.equal(a, b)
    # A different seed almost surely draws another of 1000 equally likely tokens.
    q = SamplingParams(seed=8)
    c = Sampler()(torch.zeros(1, 1000), SamplingBatch.build([(q, request_generator(q))])).token_ids
    assert not torch.equal(a, c)


def run_steps(rows: list[tuple[SamplingParams, torch.Generator | None]], logits_per_step: list[torch.Tensor],
              watch: int) -> list[int]:
    sampler = Sampler()
    tokens = []
    for logits in logits_per_step:
        tokens.append(int(sampler(logits, SamplingBatch.build(rows)).token_ids[watch]))
    return tokens


def test_seeded_request_is_independent_of_batch_composition():
    torch.manual_seed(6)
    vocab, steps = 64, 12
    mine = SamplingParams(seed=1234, temperature=0.9, top_k=40, top_p=0.95)
    my_logits = [torch.randn(vocab) for _ in range(steps)]

    def compose(others: list[SamplingParams], position: int) -> list[int]:
        params = others[:position] + [mine] + others[position:]
        rows = [(p, request_generator(p)) for p in params]  # each request keeps its generator
        logits = [
            torch.stack([my_logits[s] if i == position else torch.randn(vocab) for i in range(len(rows))])
            for s in range(steps)
        ]
        return run_steps(rows, logits, position)

    alone = compose([], 0)
    others = [SamplingParams(), SamplingParams(seed=99, min_p=0.1), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.7, top_k=3), SamplingParams(seed=5)]
    assert compose(others, 0) == alone
    assert compose(others, 3) == alone
    assert compose(others[1:4], 2) == alone
    assert compose(others, len(others)) == alone
    assert len(set(alone)) > 1  # it really sampled


def test_seed_without_generator_is_rejected():
    with pytest.raises(ValueError, match="row 1 has seed=3 but no generator"):
        SamplingBatch.build([(SamplingParams(), None), (SamplingParams(seed=3), None)])
    # Greedy rows never draw, so they need none.
    SamplingBatch.build([(SamplingParams(seed=3, temperature=0.0), None)])


def test_logits_shape_checked():
    with pytest.raises(ValueError, match=r"logits must be \[2, V\]"):
        Sampler()(torch.zeros(3, 5), batch_of(SamplingParams(), SamplingParams()))


def test_ids_past_the_vocab_limit_are_never_sampled_and_logits_stay_untouched():
    # the padding rows get the largest logits; a limit of 3 leaves ids 0..2 only, greedy or sampled
    logits = torch.tensor([[0.0, 1.0, 0.5, 9.0, 8.0]] * 500)
    before = logits.clone()
    params = [SamplingParams(temperature=0.0)] * 250 + [SamplingParams(temperature=2.0, logprobs=5)] * 250
    out = Sampler(vocab_limit=3)(logits, batch_of(*params))
    assert out.token_ids.max().item() < 3
    assert set(out.token_ids[:250].tolist()) == {1}
    assert set(out.token_ids[250:].tolist()) == {0, 1, 2}
    # logprobs are over the ids that have tokens
    assert torch.allclose(out.logprobs.exp()[:250], torch.softmax(torch.tensor([0.0, 1.0, 0.5]), 0)[1])
    assert torch.equal(logits, before)
