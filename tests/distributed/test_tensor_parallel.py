"""Tensor parallelism with real worker processes (gloo, 2 ranks on CPU): greedy tokens equal TP=1 for
every family with prefix hits at arbitrary depths, workers gone after close and after server exit, clear
errors for splits and devices that cannot work."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from flashstate import LLM, SamplingParams
from flashstate.engine.llm_engine import MAX_FAILED_STEPS_IN_A_ROW
from flashstate.models.presets import materialize_config, preset_dir
from flashstate.models.shard_plan import TensorParallelError
from flashstate.spec.preset_configs import PRESETS
from tests.models.test_shard_plan import _config

PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
ENGINE = dict(block_size=4, max_num_batched_tokens=16, prefill_cost_coefficients=(1e-5, 1e-8), max_num_seqs=8)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _capture(llm: LLM) -> dict[str, list[torch.Tensor]]:
    logits: dict[str, list[torch.Tensor]] = {}

    def hook(ids, rows):
        for rid, row in zip(ids, rows, strict=True):
            logits.setdefault(rid, []).append(row.clone())

    llm.engine.runner.on_logits = hook
    return logits


def _turns(rng: random.Random, vocab: int, outputs_of):
    """Two agents over three turns (each turn resends the context + the reply + new tokens, so it resumes
    mid-block), plus a sub-agent forked from agent 0's context at an arbitrary depth."""
    agents = [[rng.randrange(vocab) for _ in range(rng.randint(9, 23))] for _ in range(2)]
    for _ in range(3):
        fork = agents[0][: rng.randint(3, len(agents[0]))] + [rng.randrange(vocab) for _ in range(5)]
        prompts = [*agents, fork]
        outputs = outputs_of(prompts)
        agents = [
            prompts[a] + outputs[a] + [rng.randrange(vocab) for _ in range(rng.randint(1, 7))] for a in (0, 1)
        ]


FAMILIES = ["tiny", "tiny-nemotron-h", "tiny-kimi-linear", "qwen3.5-dense", "qwen3.6-moe", "granite-h-micro"]


@pytest.mark.parametrize("preset", FAMILIES)
def test_two_ranks_give_the_tokens_of_one(preset, tmp_path):
    """Presets, and the shrunk configs of test_shard_plan (random weights) for the families without one."""
    model = str(preset_dir(preset) if preset in PRESETS else materialize_config(_config(preset), tmp_path))
    one = LLM(model, **ENGINE)
    two = LLM(model, tensor_parallel_size=2, **ENGINE)
    pids = two.engine.tp.pids
    assert len(pids) == 1 and all(_alive(p) for p in pids)
    got, want = _capture(two), _capture(one)
    depths = []

    def both(prompts):
        outs, refs = two.generate(prompts, PARAMS), one.generate(prompts, PARAMS)
        for out, ref in zip(outs, refs, strict=True):
            assert out.token_ids == ref.token_ids
            assert out.num_cached_tokens == ref.num_cached_tokens
            depths.append(out.num_cached_tokens)
            for a, b in zip(got[out.request_id], want[ref.request_id], strict=True):
                assert float((a - b).norm() / b.norm()) < 1e-4
        two.engine.check_integrity()
        return [o.token_ids for o in outs]

    _turns(random.Random(preset), two.engine.spec.vocab_size, both)
    assert any(d % 4 for d in depths), f"expected hits ending mid-block, got {depths}"
    two.close()
    assert not _wait_gone(pids, timeout=1.0), "workers left running after close()"
    two.close()  # idempotent


def test_decode_batches_reach_the_workers_as_broadcast_buffers_with_steps_launched_ahead():
    """Async scheduling (steps launched before the previous tokens are read, stop tokens masked on the
    device) over TP=2: the same tokens as TP=1, and pure decode batches send no tensors down the pipe."""
    model = str(preset_dir("tiny"))
    rng = random.Random(7)
    prompts = [[rng.randrange(1, 300) for _ in range(rng.randint(5, 19))] for _ in range(4)]
    long = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with LLM(model, **ENGINE) as one:
        free = [o.token_ids for o in one.generate(prompts, long)]
        # a stop id met mid-generation by some sequences: their rows run masked in the step launched ahead
        stop = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[free[0][4]])
        stopped = [o.token_ids for o in one.generate(prompts, stop)]
    assert any(len(t) < 12 for t in stopped)
    with LLM(model, tensor_parallel_size=2, **ENGINE) as two:
        driver = two.engine.tp
        kinds = []
        send = driver.broadcast
        driver.broadcast = lambda msg: (kinds.append(msg[0]), send(msg))[1]
        assert [o.token_ids for o in two.generate(prompts, long)] == free
        assert [o.token_ids for o in two.generate(prompts, stop)] == stopped
        two.engine.check_integrity()
    assert two.engine.runner.inputs is not None
    assert kinds.count("decode") >= 11, kinds
    assert kinds.count("step") <= 6, kinds  # the prefills (and mixed steps), never a pure decode batch


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_ranks_replay_decode_graphs_with_the_tokens_of_one():
    """On GPUs every rank captures its decode graphs (their all-reduces pair up) and replays them from the
    buffers rank 0 broadcasts; fp32, so a different summation order cannot flip a greedy near tie."""
    model = str(preset_dir("tiny"))
    engine = dict(ENGINE, device="cuda", dtype="float32", kv_cache_memory_bytes=256 << 20)
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 300) for _ in range(rng.randint(5, 40))] for _ in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM(model, **engine) as one:
        want = [o.token_ids for o in one.generate(prompts, params)]
    with LLM(model, tensor_parallel_size=2, **engine) as two:
        assert two.engine.runner.graphs is not None
        assert [o.token_ids for o in two.generate(prompts, params)] == want
        two.engine.check_integrity()


def test_a_split_that_does_not_divide_the_heads_is_refused_before_any_spawn():
    with pytest.raises(
        TensorParallelError, match=r"tensor_parallel_size 3 does not divide the attention heads \(4\)"
    ):
        LLM(str(preset_dir("tiny")), tensor_parallel_size=3)
    assert not multiprocessing.active_children()


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="needs a machine with fewer than 2 GPUs")
def test_cuda_needs_one_gpu_per_rank():
    # without CUDA at all, the device check says so first (a ValueError, as TensorParallelError is)
    error = TensorParallelError if torch.cuda.is_available() else ValueError
    with pytest.raises(error, match=r"needs GPUs 0\.\.1|built without CUDA|no CUDA device is visible"):
        LLM(str(preset_dir("tiny")), device="cuda", tensor_parallel_size=2)
    assert not multiprocessing.active_children()


def test_a_dead_worker_is_an_error_not_a_hang():
    """Each step raises naming the dead worker: a request or two fail with it, then the engine gives up
    (MAX_FAILED_STEPS_IN_A_ROW failed steps with none succeeding): it is the engine, not a request."""
    with LLM(str(preset_dir("tiny")), tensor_parallel_size=2, **ENGINE) as llm:
        (pid,) = llm.engine.tp.pids
        os.kill(pid, signal.SIGKILL)
        assert not _wait_gone([pid])
        with pytest.raises(RuntimeError, match="tensor-parallel worker 1 died"):  # noqa: PT012
            for _ in range(MAX_FAILED_STEPS_IN_A_ROW):
                (out,) = llm.generate([[1, 2, 3]], PARAMS)
                assert out.finish_reason == "error" and "tensor-parallel worker 1 died" in out.error


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


def test_server_exit_stops_the_workers(tmp_path):
    from tests.server.conftest import Server  # the server's dependencies (the GPU machine has none)

    args = ["--served-model-name", "m", "--tensor-parallel-size", "2", "--kv-cache-memory-bytes", "32M"]
    args += ["--prefill-cost-coefficients", "1e-5", "1e-8"]
    server = Server(args, tmp_path / "log")
    try:
        server.wait_ready()
        status, body = server.post_json(
            "/v1/completions", {"model": "m", "prompt": [5, 6, 7, 8, 9], "max_tokens": 3, "temperature": 0}
        )
        assert status == 200 and body["usage"]["completion_tokens"] == 3, body
        workers = _children(server.proc.pid)
        assert workers, "the server started no worker process"
        server.proc.terminate()  # SIGTERM: uvicorn shuts down gracefully, then re-raises it
        server.proc.wait(timeout=30)
    finally:
        server.stop()
    assert not _wait_gone(workers), f"workers {workers} outlived the server:\n{server.log_tail()}"
    assert "tensor-parallel workers stopped (exit codes [0])" in server.log_tail(), server.log_tail()
