"""Constrained decoding through the engine, on the embedded tiny model with random weights (which would
never write JSON by itself): outputs follow their grammars, end with "stop" when the grammar is complete,
leave unconstrained requests in the same steps untouched, and never run a step ahead (async scheduling)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from flashstate import LLM, SamplingParams
from flashstate.engine.structured import GrammarError, compile_grammar
from flashstate.engine.structured.bitmask import TokenBitmask
from flashstate.engine.structured.matcher import GrammarMatcher
from flashstate.layers.sampler import apply_token_bitmask
from flashstate.structured_output import StructuredOutput

try:
    import jsonschema_rs
except ImportError:  # pragma: no cover - the test extra installs it (through schemathesis)
    jsonschema_rs = None

COST = (1e-5, 1e-10)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "manager": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
    },
    "required": ["name", "age", "tags", "manager"],
    "additionalProperties": False,
}
# What the tool-calling layer builds for tool_choice "required": one of the tools, its arguments nested.
TOOL_CALL = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "name": {"const": "get_weather"},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 12},
                        "unit": {"enum": ["celsius", "fahrenheit"]},
                        "when": {
                            "type": "object",
                            "properties": {"days": {"type": "integer", "minimum": 0, "maximum": 9}},
                            "required": ["days"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["city", "unit", "when"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "name": {"const": "stop_timer"},
                "arguments": {
                    "type": "object",
                    "properties": {"id": {"enum": [1, 2, 3]}},
                    "required": ["id"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
    ]
}
PROMPTS = ["Hello there", "Give me JSON:", [5, 6, 7, 8, 9], "Another request, somewhat longer than the rest"]


def assert_valid(instance: object, schema: dict) -> None:
    if jsonschema_rs is not None:
        jsonschema_rs.validate(schema, instance)
        return
    assert isinstance(instance, dict) and set(instance) == set(schema["required"])  # pragma: no cover


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, prefill_cost_coefficients=COST, max_num_seqs=8, max_num_batched_tokens=128)


def _params(so: StructuredOutput, **kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0, "max_tokens": 96, "structured_output": so, **kw})


@pytest.mark.parametrize("schema", [PERSON, TOOL_CALL], ids=["person", "tool_call"])
def test_json_schema_output_validates(llm, schema):
    params = [_params(StructuredOutput(json=schema))] * 2
    params += [_params(StructuredOutput(json=json.dumps(schema)), temperature=1.0, seed=s) for s in range(2)]
    outs = llm.generate(PROMPTS, params)
    for o in outs:
        assert o.finish_reason == "stop", o.text
        assert_valid(json.loads(o.text), schema)
    assert len({o.text for o in outs}) > 1  # the rows' own logits choose within the grammar


def test_properties_come_in_the_schemas_order(llm):
    out = llm.generate("x", _params(StructuredOutput(json=TOOL_CALL)))[0]
    assert list(json.loads(out.text)) == ["name", "arguments"]


def test_choice_regex_and_grammar(llm):
    choices = ("yes", "no", "maybe later")
    outs = llm.generate(PROMPTS, [_params(StructuredOutput(choice=choices))] * len(PROMPTS))
    assert all(o.text in choices and o.finish_reason == "stop" for o in outs)
    pattern = r"[a-z]{3}-[0-9]{2,4}"
    outs = llm.generate(PROMPTS, [_params(StructuredOutput(regex=pattern))] * len(PROMPTS))
    assert all(re.fullmatch(pattern, o.text) and o.finish_reason == "stop" for o in outs)
    gbnf = 'root ::= "ab" | "cd" digit\ndigit ::= [0-9]'
    lark = 'start: "x" NUM\nNUM: /[0-9]{2}/'
    outs = llm.generate(PROMPTS[:2], [_params(StructuredOutput(grammar=g)) for g in (gbnf, lark)])
    assert outs[0].text == "ab" or re.fullmatch(r"cd\d", outs[0].text)
    assert re.fullmatch(r"x\d\d", outs[1].text)


def test_json_object_output_is_an_object_as_far_as_it_goes(llm):
    """Random weights rarely close a JSON string, so most outputs stop at max_tokens: each output's tokens
    are what the grammar allowed at every step, and the ones the grammar completed parse as objects."""
    so = StructuredOutput(json_object=True)
    outs = llm.generate(PROMPTS, [_params(so, temperature=1.0, seed=s, max_tokens=24) for s in range(4)])
    for o in outs:
        assert o.text.startswith("{")
        matcher = llm.engine.structured.matcher(so)
        assert not any(matcher.advance(t) for t in o.token_ids[:-1])
        if o.finish_reason == "stop":
            assert isinstance(json.loads(o.text), dict)
        else:
            assert o.finish_reason == "length" and not matcher.advance(o.token_ids[-1])


def test_unconstrained_rows_are_untouched_in_shared_steps(tiny_model_dir):
    plain = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2) for _ in range(3)]
    prompts = ["one two three", [11, 12, 13], "four five"]
    alone = LLM(tiny_model_dir, prefill_cost_coefficients=COST, max_num_seqs=8).generate(prompts, plain)
    llm = LLM(tiny_model_dir, prefill_cost_coefficients=COST, max_num_seqs=8)
    mixed = llm.generate(
        [prompts[0], "c1", prompts[1], "c2", prompts[2]],
        [
            plain[0],
            _params(StructuredOutput(json=PERSON)),
            plain[1],
            _params(StructuredOutput(choice=("a", "b"))),
            plain[2],
        ],
    )
    got = [mixed[0], mixed[2], mixed[4]]
    assert [o.token_ids for o in got] == [o.token_ids for o in alone]
    for g, w in zip(got, alone, strict=True):
        assert g.logprobs == pytest.approx(w.logprobs, rel=1e-4, abs=1e-5)
    assert_valid(json.loads(mixed[1].text), PERSON)
    assert mixed[3].text in ("a", "b")


def test_constrained_batches_never_run_a_step_ahead(tiny_model_dir):
    """Async scheduling samples step n+1 before step n's tokens are read; a grammar's mask needs them, so a
    batch with a constrained row runs step by step, and the pipeline resumes once it is gone."""
    llm = LLM(tiny_model_dir, prefill_cost_coefficients=COST, max_num_seqs=8, async_scheduling=True)
    engine, launches = llm.engine, []
    for owner, name in ((engine, "_pipeline"), (engine.runner, "launch_ahead")):
        method = getattr(owner, name)
        setattr(owner, name, lambda *a, _f=method, _n=name: launches.append(_n) or _f(*a))
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm.generate(["a b c", "d e f"], plain)
    assert launches.count("launch_ahead") > 5  # the pipeline runs for unconstrained batches
    launches.clear()
    outs = llm.generate(["a b c", "d e f"], [plain, _params(StructuredOutput(json=PERSON))])
    assert launches == []
    assert_valid(json.loads(outs[1].text), PERSON)
    sync = LLM(tiny_model_dir, prefill_cost_coefficients=COST, max_num_seqs=8).generate("a b c", plain)
    assert outs[0].token_ids == sync[0].token_ids


def test_stop_strings_with_a_grammar(llm):
    """A request with stop strings keeps its text in the step loop: text held back as a possible stop-string
    start goes out when the grammar ends the request."""
    so = StructuredOutput(choice=("alpha!", "beta!"))
    out = llm.generate("x", _params(so, stop=["!!"]))[0]
    assert out.text in ("alpha!", "beta!") and out.finish_reason == "stop"


def test_a_bad_constraint_is_refused_naming_the_field(llm):
    cases = [
        (StructuredOutput(json={"type": "objectx"}), "json"),
        (StructuredOutput(json={"$ref": "#/$defs/missing"}), "json"),
        (StructuredOutput(regex="(unclosed"), "regex"),
        (StructuredOutput(grammar="start: undefined_rule"), "grammar"),
        (StructuredOutput(structural_tag='{"structures": 1}'), "structural_tag"),
    ]
    for so, field in cases:
        with pytest.raises(GrammarError) as e:
            compile_grammar(so)
        assert e.value.field == field and str(e.value).startswith(field)
        with pytest.raises(ValueError, match=f"^{field} "):
            llm.engine.add_request("x", _params(so))
    assert not llm.engine.has_unfinished()


def test_structured_output_shape_checks():
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutput()
    with pytest.raises(ValueError, match="json, regex"):
        StructuredOutput(json={}, regex="a")
    with pytest.raises(ValueError, match="choice"):
        StructuredOutput(choice=[])
    assert StructuredOutput(choice=["a"]).choice == ("a",)


def test_eos_is_allowed_only_where_the_grammar_accepts(llm):
    engine = llm.engine
    eos = engine.eos_token_ids[0]
    matcher = engine.structured.matcher(StructuredOutput(regex=r"\d+"))
    bitmask = TokenBitmask(engine.structured.vocabulary.vocab_size, pin=False)

    def allowed(m: GrammarMatcher) -> torch.Tensor:
        mask = bitmask.build([m, None])
        assert (mask[1] == -1).all()  # an unconstrained row allows everything
        logits = apply_token_bitmask(torch.zeros(2, engine.spec.vocab_size), mask)
        return logits[0].isfinite()

    assert not allowed(matcher)[eos]
    digit = engine.tokenizer.encode("7")
    assert len(digit) == 1 and allowed(matcher)[digit[0]]
    assert not matcher.advance(digit[0]) and matcher.accepting
    assert allowed(matcher)[eos]
    assert matcher.advance(eos) and matcher.done


def test_apply_token_bitmask_masks_exactly_the_cleared_bits():
    vocab = 70  # three words, the last one partly past the vocabulary
    mask = torch.zeros(2, 3, dtype=torch.int32)
    mask[0, 0] = 1 << 5
    mask[0, 2] = 1 << 1  # token 65
    mask[1, 1] = -(1 << 31)  # bit 31 of word 1: token 63
    logits = torch.randn(2, vocab)
    out = apply_token_bitmask(logits, mask)
    assert out[0].isfinite().nonzero().flatten().tolist() == [5, 65]
    assert out[1].isfinite().nonzero().flatten().tolist() == [63]
    assert torch.equal(out[0, [5, 65]], logits[0, [5, 65]])
