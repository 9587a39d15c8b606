"""Constrained decoding's cost per decode step (issue 29): every row under a JSON-schema grammar against
the same rows unconstrained, at batch 1 and 48, on a GPU preset.

    source benchmarks/gpu/device_env.sh && python benchmarks/gpu/structured_overhead.py

Three ways to run the same decode steps:

    free        unconstrained, async scheduling (a step launched before the last one's tokens are read)
    free sync   unconstrained, each step read before the next (what any constrained batch does)
    json        every row under a tool-call JSON schema: per step the host fills a [B, 151936/32] bitmask
                (llguidance, threads), uploads it and masks the logits; no step ahead

The presets carry the embedded 2,048-token tokenizer, whose masks are cheap to fill; `--vocab synthetic`
(default) gives the grammars a 151,936-token byte-level vocabulary instead (made-up tokens shaped like a
BPE vocabulary's), so the fill costs what a Qwen tokenizer's would. The rows write into a free JSON
string, which random weights never close, so every row decodes for the whole measurement.

Prints a table last and writes $OUT/structured_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

import tokenizers
import torch

sys.path.insert(0, str(Path(__file__).parent))

from engine_setup import make_llm, prompt, timed  # noqa: E402

from flashstate import SamplingParams  # noqa: E402
from flashstate.engine.structured import StructuredDecoding  # noqa: E402
from flashstate.models.presets import preset_dir  # noqa: E402
from flashstate.structured_output import StructuredOutput  # noqa: E402
from flashstate.tokenizer import Tokenizer  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"const": "run_command"},
        "arguments": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "integer"},
                "mode": {"enum": ["sync", "async"]},
            },
            "required": ["command", "timeout", "mode"],
        },
    },
    "required": ["name", "arguments"],
}


def synthetic_tokenizer(base: Tokenizer, size: int) -> Tokenizer:
    """`base`'s byte-level BPE with made-up tokens up to `size` (words with and without a leading space,
    punctuation runs, numbers, byte strings), its special tokens moved to the end."""
    spec = json.loads(base.backend.to_str())
    specials = spec["added_tokens"]
    vocab = dict(spec["model"]["vocab"])
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    rng = random.Random(0)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    punct = list("{}[]():;,.\"'=+-*/<>_#!?&|\\") + ["Ċ", "ĉ", "ĠĠ", "ĠĠĠĠ"]
    target = size - len(specials)
    while len(vocab) < target:
        r = rng.random()
        if r < 0.6:
            w = "".join(rng.choices(letters, k=min(int(rng.expovariate(0.25)) + 2, 14)))
            w = ("Ġ" if rng.random() < 0.55 else "") + (w.capitalize() if rng.random() < 0.3 else w)
        elif r < 0.75:
            w = "".join(rng.choices(punct, k=rng.randint(2, 4)))
        elif r < 0.85:
            w = ("Ġ" if rng.random() < 0.5 else "") + str(rng.randint(0, 999))
        else:
            w = "".join(rng.choices(alphabet, k=rng.randint(2, 5)))
        vocab.setdefault(w, len(vocab))
    spec["model"]["vocab"], spec["model"]["merges"] = vocab, []
    for i, t in enumerate(specials):
        t["id"] = target + i
    return Tokenizer(tokenizers.Tokenizer.from_str(json.dumps(spec)), special_tokens=base.special_tokens)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(llm, batch: int, mode: str, steps: int) -> dict:
    engine = llm.engine
    so = StructuredOutput(json=SCHEMA) if mode == "json" else None
    params = SamplingParams(max_tokens=steps + 64, temperature=0, ignore_eos=True, structured_output=so)
    for i in range(batch):
        engine.add_request(prompt(64, seed=1000 * batch + i), params)
    engine.runner.on_logits = (lambda ids, logits: None) if mode == "free sync" else None  # no step ahead
    while engine.scheduler.waiting or any(
        s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running
    ):
        engine.step()
    for _ in range(5):
        engine.step()
    totals = {"fill": 0.0}
    fill = engine._grammar_bitmask
    timed(engine, "_grammar_bitmask", totals, "fill")
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    seconds = time.perf_counter() - start
    engine._grammar_bitmask = fill
    rows = len(engine.scheduler.running)
    for rid in list(engine.requests):
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    engine.runner.on_logits = None
    return dict(
        batch=batch,
        mode=mode,
        rows_at_end=rows,
        step_ms=1e3 * seconds / steps,
        fill_ms=1e3 * totals["fill"] / steps,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="qwen3-next-2b")
    p.add_argument("--batches", default="1,48")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--vocab", choices=("synthetic", "model"), default="synthetic")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    llm = make_llm(preset_dir(args.preset))
    engine = llm.engine
    if args.vocab == "synthetic":
        tok = synthetic_tokenizer(engine.tokenizer, engine.spec.vocab_size)
        eos = [tok.backend.token_to_id("<|endoftext|>")]
        engine.structured = StructuredDecoding(tok, engine.spec.vocab_size, eos, pin=True)
    start = time.perf_counter()
    engine.structured.matcher(StructuredOutput(json=SCHEMA))  # the vocabulary, built once per engine
    vocab_s = time.perf_counter() - start
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for mode in ("free", "free sync", "json"):
            rows.append(measure(llm, batch, mode, args.steps))
            print(rows[-1], flush=True)
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    result = dict(preset=args.preset, vocab=args.vocab, vocabulary_build_s=vocab_s, rows=rows)
    (out / "structured_overhead.json").write_text(json.dumps(result, indent=1))
    size = engine.structured.vocabulary.vocab_size
    print(f"{args.preset}, {args.vocab} vocabulary ({size} tokens, built in {vocab_s:.2f} s), {args.steps} "
          f"decode steps, {torch.cuda.get_device_name()}")  # fmt: skip
    print("| batch | free (async) | free, sync | json schema | mask fill (host) | json vs free sync |")
    by = {(r["batch"], r["mode"]): r for r in rows}
    for batch in sorted({r["batch"] for r in rows}):
        free, free_sync, js = by[batch, "free"], by[batch, "free sync"], by[batch, "json"]
        print(
            f"| {batch} | {free['step_ms']:.2f} ms | {free_sync['step_ms']:.2f} ms | {js['step_ms']:.2f} ms "
            f"(rows {js['rows_at_end']}) | {js['fill_ms']:.2f} ms | "
            f"{100 * (js['step_ms'] / free_sync['step_ms'] - 1):+.0f}% |"
        )


if __name__ == "__main__":
    main()
