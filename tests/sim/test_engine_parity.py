"""One post-processing path: the simulator and the engine, fed the same multi-turn replay step by step, make
the same cache decisions at every step — the batch (who runs, how many tokens, which checkpoints are
exported), then the hits, admissions, evictions and free pool entries after the step.

Both run the real Scheduler and CacheManager; the engine runs the tiny model on the CPU, the simulator only
counts. Their tokens differ (greedy on random weights vs a seeded stream), so each session's next turn is
built from that engine's own output: the prompts differ in content, never in shape. The policies compared
use no wall-clock time in their decisions (GDS priorities; vLLM's page pool orders by use, not by time)."""

from __future__ import annotations

import random

import pytest
import torch

from flashstate import LLM, SamplingParams
from flashstate.cache.cache_tensors import kv_bytes_per_block, state_bytes_per_slot
from flashstate.cache.cost import PrefillCost
from flashstate.config import EngineConfig
from flashstate.sim.engine import SimEngine
from flashstate.sim.profile import DecodeModel
from flashstate.spec.hf_config import spec_from_hf

COEFFICIENTS = (1e-5, 1e-10)
SESSIONS, TURNS, OUTPUT = 6, 4, 6


def _turns(seed: int, vocab: int) -> list[list[list[int]]]:
    """Per session, its turns' new tokens; sessions share a system prompt, as an agent's do."""
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(40)]
    return [
        [system + [rng.randrange(vocab) for _ in range(rng.randint(5, 30))]]
        + [[rng.randrange(vocab) for _ in range(rng.randint(5, 60))] for _ in range(TURNS - 1)]
        for _ in range(SESSIONS)
    ]


class _Driver:
    """A closed-loop replay: every session's first turn at once; a session's next turn is queued at the
    step boundary where its previous one finished, its prompt = the previous prompt + that output + new
    tokens. Each step's decisions are recorded."""

    def __init__(self, scheduler, cache, turns):
        self.scheduler, self.cache, self.turns = scheduler, cache, turns
        self.log: list[tuple] = []
        self.prompts: dict[str, tuple[int, int, list[int]]] = {}  # request id → (session, turn, prompt)
        schedule = scheduler.schedule

        def recording_schedule():
            batch = schedule()
            rows = [
                (self.prompts[s.request_id][:2], n) for s, n in zip(batch.seqs, batch.num_tokens, strict=True)
            ]
            self.log.append(("batch", rows, sorted(batch.exports)))
            return batch

        scheduler.schedule = recording_schedule

    def after_step(self) -> None:
        st = self.cache.stats
        self.log.append(
            (
                "cache",
                st.queries,
                st.hits,
                st.cached_tokens,
                st.admissions_refused,
                sorted(st.evictions.items()),
                st.checkpoints,
                self.cache.block_pool.num_free,
                self.cache.state_pool.num_free,
            )
        )

    def next_prompt(self, request_id: str, output: list[int]) -> tuple[int, int, list[int]] | None:
        session, turn, prompt = self.prompts[request_id]
        if turn + 1 == TURNS:
            return None
        return session, turn + 1, prompt + output + self.turns[session][turn + 1]


def _config(policy: str, budget: int) -> dict:
    return dict(
        device="cpu",
        max_num_seqs=4,
        max_num_batched_tokens=64,  # prompts of up to ~300 tokens: chunked prefill
        block_size=8,
        cache_policy=policy,
        kv_cache_memory_bytes=budget,
        prefill_cost_coefficients=COEFFICIENTS,
        prefix_cache_leaf_last=False,  # protection reads the wall clock
        # a decode launched ahead is by construction the batch schedule() would give
        # (LLMEngine._next_decode), but it skips the call this test records
        async_scheduling=False,
    )


def _run_engine(model_dir: str, kw: dict, turns) -> list[tuple]:
    llm = LLM(model_dir, **kw)
    engine = llm.engine
    d = _Driver(engine.scheduler, engine.cache, turns)
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT, ignore_eos=True)

    def add(session: int, turn: int, prompt: list[int]) -> None:
        rid = f"s{session}t{turn}"
        d.prompts[rid] = (session, turn, prompt)
        engine.add_request(prompt, params, request_id=rid)

    for s, t in enumerate(turns):
        add(s, 0, t[0])
    while engine.has_unfinished():
        outputs = engine.step()
        d.after_step()
        for out in outputs:
            if out.finished and (nxt := d.next_prompt(out.request_id, list(out.token_ids))) is not None:
                add(*nxt)
    return d.log


def _run_sim(model_dir: str, kw: dict, turns) -> list[tuple]:
    spec = spec_from_hf(model_dir)
    now = [0.0]
    sim = SimEngine(
        EngineConfig(**kw),
        spec,
        "float32",
        PrefillCost(*COEFFICIENTS),
        DecodeModel(1e-3, 0.0, 0.0),
        clock=lambda: now[0],
        max_token_id=spec.vocab_size,
    )
    sim.decode_runs = False  # step by step, as the engine
    d = _Driver(sim.scheduler, sim.cache, turns)
    seqs = {}

    def add(session: int, turn: int, prompt: list[int]) -> None:
        rid = f"s{session}t{turn}"
        d.prompts[rid] = (session, turn, prompt)
        seqs[rid] = sim.add(rid, prompt, OUTPUT, seed=hash((session, turn)) & 0xFFFF)

    for s, t in enumerate(turns):
        add(s, 0, t[0])
    while sim.has_work:
        started = sim.start_step()
        if started is None:
            d.after_step()
            continue
        batch, seconds = started
        now[0] += seconds
        sim.finish_step(batch)
        d.after_step()
        for rid, seq in list(seqs.items()):
            if seq.is_finished:
                del seqs[rid]
                if (nxt := d.next_prompt(rid, seq.token_ids[seq.num_prompt_tokens :])) is not None:
                    add(*nxt)
    return d.log


def _budget(model_dir: str, slots: int, blocks: int, block_size: int = 8) -> int:
    spec = spec_from_hf(model_dir)
    return slots * state_bytes_per_slot(spec, torch.float32) + blocks * kv_bytes_per_block(
        spec, block_size, torch.float32
    )


@pytest.mark.parametrize("policy", ["flashstate", "vllm"])
def test_engine_and_simulator_decide_alike_step_by_step(tiny_model_dir, policy):
    # room for a few sessions' checkpoints and KV, not all: admissions are refused and units evicted
    kw = _config(policy, _budget(tiny_model_dir, slots=14, blocks=160))
    turns = _turns(0, spec_from_hf(tiny_model_dir).vocab_size)
    engine_log = _run_engine(tiny_model_dir, kw, turns)
    sim_log = _run_sim(tiny_model_dir, kw, turns)
    evicted = [entry for entry in engine_log if entry[0] == "cache" and entry[5]]
    hits = engine_log[-1][2] if engine_log[-1][0] == "cache" else 0
    assert evicted and hits > 0, "the replay must exercise hits and evictions"
    for step, (e, s) in enumerate(zip(engine_log, sim_log, strict=True)):
        assert e == s, f"step {step // 2}: engine {e} != simulator {s}"
