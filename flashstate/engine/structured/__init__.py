"""Constrained decoding: a request's StructuredOutput as a grammar that masks its logits every step.

    grammar.py      StructuredOutput → llguidance grammar text, checked and cached (no tokenizer)
    vocabulary.py   the model tokenizer's vocabulary as llguidance sees it, built once per engine
    matcher.py      one request's grammar state: the next-token mask, advanced by each sampled token
    bitmask.py      a step's masks for the rows that sample, one [n, ceil(V/32)] int32 tensor
    decoding.py     the engine's facade: matchers for new requests, the bitmask for a step

The library is llguidance, chosen over xgrammar by measurement on a 2-core AMD EPYC (a tool-call JSON
schema with an enum, an anyOf and nested objects; an 830-character instance, 370-413 tokens):

    vocabulary                  library     compile   mask fill per token (mean / median)
    151,936 tokens (synthetic)  llguidance  1.6 ms    30-54 us / 5-11 us
                                xgrammar    34-41 ms  41-46 us / 41-46 us
    2,048 (embedded tiny)       llguidance  1.1 ms    7 us / 3 us
                                xgrammar    1.9 ms    3 us / 3 us

Mask fill is tens of microseconds either way (a decode step takes milliseconds); llguidance compiles a
schema 20x faster (xgrammar precomputes per-state token masks at compile time), which matters because
every tool-calling request brings its own schema, and it has no dependencies (a 3 MB abi3 wheel for
x86_64 and aarch64 Linux), where xgrammar pulls in triton, apache-tvm-ffi and transformers.
"""

from flashstate.engine.structured.decoding import StructuredDecoding
from flashstate.engine.structured.grammar import GrammarError, compile_grammar
from flashstate.engine.structured.matcher import GrammarMatcher

__all__ = ["GrammarError", "GrammarMatcher", "StructuredDecoding", "compile_grammar"]
