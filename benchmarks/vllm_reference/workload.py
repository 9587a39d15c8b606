"""The multi-turn workload replayed through real vLLM and through flashstate's `vllm` cache policy.

Standard library only: `replay_vllm.py` (vLLM venv) and `replay_flashstate.py` (repo venv) both import
it, so the two replays build every prompt the same way.

    /work/main/.venv/bin/python benchmarks/vllm_reference/workload.py OUT.json [--seed 0] [--block 288]

The spec is explicit JSON: a list of requests, replayed strictly in order, one at a time. Each request

    {"id": "a0.t1", "base": BASE, "new": [token ids], "max_tokens": m, "note": "..."}

has the prompt `base tokens + new`, where BASE is

    null                                   nothing (a fresh prompt)
    {"segment": "system"}                  a named token list from spec["segments"]
    {"request": "a0.t0", "take": "prompt+output"}
                                           that earlier request's prompt followed by the tokens the
                                           model generated for it (a multi-turn continuation)
    {"request": "b0", "take": 1500}        the first 1500 tokens of that earlier request's prompt

Every request is greedy (temperature 0) with `ignore_eos`, so its output has exactly `max_tokens`
tokens and every prompt's *length* is fixed by the spec (`expected_prompt_len`); only the token
*contents* of continuations depend on what the model generated. `PromptBuilder` resolves BASEs from the
outputs the replaying engine itself generated (`build(req)` then `record(req_id, prompt, output)`).
Use the engine's own outputs, never another engine's: vLLM caches the KV blocks of generated tokens,
so a continuation carrying foreign output tokens would diverge from the engine's cached path inside
the output, a different cache situation. (Greedy outputs of this random-weight bf16 model are not
even reproducible run to run on vLLM CPU; the cached-token counts are, because they depend only on
which prefixes are shared, which the spec fixes.)

The default spec is designed around vLLM's block B (`--block`, 288 for the checkpoint of
`make_checkpoint.py` on vLLM CPU): 4 agents x 6 interleaved turns (shared 700-token system prompt,
turns ending mid-block, one agent whose first prompt is exactly 4B, one agent past the 4096-token
prefill chunk), plus probes: a 2000-token prompt and a prompt sharing only its first 1500 tokens, a
prompt sharing exactly its first floor(2000/B)*B tokens, one sharing a few tokens more, a second
branch off the 1500-token junction, an exact repeat of an earlier prompt (mid-block and block-aligned),
a fork from an agent's older turn, a 6000-token prompt with a branch just past the first prefill
chunk, and a branch off a turn at a point inside the previous turn's generated tokens.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

# Token ids used for random text: the default tokenizer's ordinary ids (2045-2047 are special tokens).
TOKEN_LO, TOKEN_HI = 0, 2045


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]


def make_spec(seed: int = 0, block: int = 288, agents: int = 4, turns: int = 6) -> dict[str, Any]:
    rng = random.Random(seed)
    B = block
    segments = {"system": _tokens(rng, 700)}
    reqs: list[dict[str, Any]] = []

    def add(rid: str, base: Any, new_len: int, max_tokens: int, note: str = "") -> None:
        reqs.append(
            {"id": rid, "base": base, "new": _tokens(rng, new_len), "max_tokens": max_tokens, "note": note}
        )

    def turn_base(a: int, t: int) -> Any:
        return {"segment": "system"} if t == 0 else {"request": f"a{a}.t{t - 1}", "take": "prompt+output"}

    for t in range(turns):
        for a in range(agents):
            if t == 0:
                # Agent 3's first prompt is exactly 4 blocks; the others end mid-block.
                new = 4 * B - 700 if a == 3 else rng.randint(200, 1200)
                note = (
                    "first turn, prompt = 4B exactly"
                    if a == 3
                    else "first turn (shares the 700-token system prompt)"
                )
            elif a == 2:
                new, note = rng.randint(700, 1000), "long turn (agent 2 passes the 4096-token prefill chunk)"
            else:
                new, note = rng.randint(30, 600), "next turn = previous prompt + output + new"
            out = rng.choice([16, 40, 120, 300]) if a != 3 or t != 0 else 32
            add(f"a{a}.t{t}", turn_base(a, t), new, out, note)
        if t == 1:
            add("b0", None, 2000, 16, "fresh 2000-token prompt")
            add("b1", {"request": "b0", "take": 1500}, 500, 16, "shares 1500 of b0's 2000 tokens")
            k = 2000 // B * B
            add("b2", {"request": "b0", "take": k}, 300, 16, f"shares exactly b0's last boundary {k}")
            add("b3", {"request": "b0", "take": k + 40}, 200, 16, f"shares b0's first {k + 40} tokens")
            add("b4", {"request": "b1", "take": 1500}, 300, 16, "branches at b1's 1500-token junction")
        if t == 2:
            add(
                "r0",
                {"request": "a0.t0", "take": "prompt"},
                0,
                16,
                "exact repeat of a0.t0's prompt (mid-block)",
            )
            add("r1", {"request": "a3.t0", "take": "prompt"}, 0, 16, "exact repeat of a3.t0's prompt (= 4B)")
            add("f0", {"request": "a1.t0", "take": "prompt"}, 150, 16, "fork off a1's first-turn prompt")
        if t == 3:
            add("l0", None, 6000, 16, "fresh 6000-token prompt (prefilled in chunks)")
            add("l1", {"request": "l0", "take": 4100}, 200, 16, "shares l0's first 4100 tokens")
        if t == 4 and agents > 2:
            # a2.t4 continued a2.t3 past the end of a2.t3's prompt, into a2.t3's output: branch there.
            lens = expected_prompt_lengths({"segments": segments, "requests": reqs})
            prev = next(q for q in reqs if q["id"] == "a2.t3")
            k = lens["a2.t3"] + prev["max_tokens"] // 2
            add(
                "g0",
                {"request": "a2.t4", "take": k},
                200,
                16,
                f"shares a2.t4's first {k} tokens (inside a2.t3's generated tokens)",
            )
    spec = {
        "format": "flashstate-vllm-reference-workload/1",
        "seed": seed,
        "designed_for_block": B,
        "agents": agents,
        "turns": turns,
        "segments": segments,
        "requests": reqs,
    }
    spec["expected_prompt_len"] = expected_prompt_lengths(spec)
    return spec


def expected_prompt_lengths(spec: dict[str, Any]) -> dict[str, int]:
    """Prompt length of every request (fixed by the spec, because every output has max_tokens tokens)."""
    plen: dict[str, int] = {}
    for r in spec["requests"]:
        base = r["base"]
        if base is None:
            n = 0
        elif "segment" in base:
            n = len(spec["segments"][base["segment"]])
        elif base["take"] == "prompt+output":
            src = next(q for q in spec["requests"] if q["id"] == base["request"])
            n = plen[base["request"]] + src["max_tokens"]
        elif base["take"] == "prompt":
            n = plen[base["request"]]
        else:
            n = int(base["take"])
            assert n <= plen[base["request"]], (r["id"], n)
        plen[r["id"]] = n + len(r["new"])
    return plen


class PromptBuilder:
    """Builds each request's prompt from the spec and the outputs this replay has generated so far."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.prompts: dict[str, list[int]] = {}
        self.outputs: dict[str, list[int]] = {}

    def build(self, req: dict[str, Any]) -> list[int]:
        base = req["base"]
        if base is None:
            head: list[int] = []
        elif "segment" in base:
            head = list(self.spec["segments"][base["segment"]])
        else:
            src = base["request"]
            if base["take"] == "prompt+output":
                head = self.prompts[src] + self.outputs[src]
            elif base["take"] == "prompt":
                head = list(self.prompts[src])
            else:
                head = self.prompts[src][: int(base["take"])]
        prompt = head + list(req["new"])
        want = self.spec["expected_prompt_len"][req["id"]]
        if len(prompt) != want:
            raise ValueError(f"{req['id']}: prompt has {len(prompt)} tokens, the spec says {want}")
        return prompt

    def record(self, req_id: str, prompt: list[int], output: list[int]) -> None:
        self.prompts[req_id] = list(prompt)
        self.outputs[req_id] = list(output)


def load_spec(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block", type=int, default=288, help="vLLM's block size the probes are placed for")
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--turns", type=int, default=6)
    a = p.parse_args()
    spec = make_spec(a.seed, a.block, a.agents, a.turns)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(spec, separators=(",", ":")) + "\n")
    lens = spec["expected_prompt_len"]
    lo, hi = min(lens.values()), max(lens.values())
    print(f"wrote {a.out}: {len(spec['requests'])} requests, prompt lengths {lo}..{hi}")


if __name__ == "__main__":
    main()
