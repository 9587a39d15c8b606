"""The GPU start-up warm-up: every serving path's kernels built before the first request.

A fresh prefill, a prefill over a cached prefix exporting a state, mixed and decode steps, at every
power-of-two step size up to the token budget: some kernels are tuned per size class (the short conv), and a
class first met while serving would stall that step for seconds. The caller then starts a fresh cache, so
nothing of this is served or counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashstate.sampling_params import SamplingParams

if TYPE_CHECKING:
    from flashstate.engine.llm_engine import LLMEngine


def warm_up(engine: LLMEngine) -> None:
    top = min(engine.config.max_num_batched_tokens, engine.max_model_len // 2)
    # largest first: a kernel tuned per size class is tuned at the longest batch of the class
    sizes = sorted({min(top, 1 << k) for k in range(1, top.bit_length() + 1)} - {1}, reverse=True)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    for n in sizes:
        first = [(7 * i + n) % (engine.spec.vocab_size - 1) + 1 for i in range(n)]
        for ids, marks in ((first, [n // 2]), (first + first[: n // 2], [n + n // 4])):
            engine.add_request(ids, params, checkpoint_positions=marks)
            engine.add_request(first[: max(1, n // 3)], params)  # a second sequence: mixed steps
            while engine.has_unfinished():
                engine.step()
