"""A tensor-parallel worker process (rank ≥ 1): loads its share of the model, allocates its share of the
KV blocks and state slots, then replays every step rank 0 sends it.

Messages on the pipe from rank 0, in order:
    ("plan", num_blocks, num_slots)                      once, after the worker reported ("ready", budget)
    ("step", copies, input_ids, metadata)                a forward; copies: [(op, src, dst)] applied first
    ("decode_setup", max_batch, width, capture)          once, answered ("decode_ready",) once set up
    ("decode", copies, rows, graphed, tables_changed)    a decode batch: rank 0's decode buffers arrive by
                                                         broadcast, then a graph replay or an eager forward
    ("shutdown",)
The worker exits when the pipe closes (rank 0 died) and reports any failure as ("error", traceback); on
Linux the kernel also kills it when rank 0 exits (PR_SET_PDEATHSIG), even while it is stuck in a
collective or not reading the pipe.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import signal
import traceback
from multiprocessing.connection import Connection

import torch

from flashstate import envs
from flashstate.config import EngineConfig
from flashstate.distributed.group import (
    TPGroup,
    bind_host,
    broadcast_decode_inputs,
    client_store,
    disable_nvls,
    rank_device,
    split_cpu_threads,
)
from flashstate.lifeline import die_with_parent
from flashstate.models.shard_plan import Shard


def run_worker(
    config: EngineConfig,
    model_dir: str,
    rank: int,
    port: int,
    conn: Connection,
    parent_pid: int | None = None,
) -> None:
    die_with_parent(signal.SIGKILL, parent_pid)  # killed now if rank 0 is already gone
    disable_nvls()
    dump_stacks_when_stuck()
    try:
        _serve(config, model_dir, rank, port, conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        os._exit(1)  # rank 0 is gone
    except BaseException:  # noqa: BLE001 — report whatever it was, then die
        with contextlib.suppress(OSError):
            conn.send(("error", f"tensor-parallel rank {rank}: {traceback.format_exc()}"))
        os._exit(1)


def dump_stacks_when_stuck() -> None:
    """With FLASHSTATE_STACK_DUMP_S=<seconds> in the environment, this process writes every thread's Python
    stack to stderr at that interval: a rank stuck in a collective shows where (a debugging aid)."""
    seconds = envs.FLASHSTATE_STACK_DUMP_S
    if seconds > 0:
        faulthandler.dump_traceback_later(seconds, repeat=True)


def _serve(config: EngineConfig, model_dir: str, rank: int, port: int, conn: Connection) -> None:
    from flashstate.cache.cache_tensors import CacheTensors, kv_dtype
    from flashstate.cache.memory_plan import cache_budget
    from flashstate.device import resolve_device
    from flashstate.engine.worker.cuda_graph import DecodeGraphs
    from flashstate.engine.worker.decode_inputs import DecodeInputs
    from flashstate.models.loader import load_model
    from flashstate.spec.model_spec import DTYPES

    world = config.tensor_parallel_size
    device = rank_device(resolve_device(config.device), rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    split_cpu_threads(device, world)
    host = bind_host(config.host)
    store = client_store(port, world, host)
    conn.send(("hello",))
    group = TPGroup(store, rank, world, device, host)
    dtype = None if config.dtype == "auto" else DTYPES[config.dtype]
    model = load_model(model_dir, dtype=dtype, device=device, shard=Shard(rank, world))
    group.attach(model)
    conn.send(("ready", cache_budget(config, device)))
    _, num_blocks, num_slots = pickle.loads(conn.recv_bytes())
    model_dtype = next(model.parameters()).dtype
    kv = kv_dtype(config.kv_cache_dtype, model_dtype)
    caches = CacheTensors.allocate(
        model.spec, num_blocks, config.block_size, num_slots, model_dtype, device, kv
    )
    caches.bind(model)
    inputs: DecodeInputs | None = None
    graphs: DecodeGraphs | None = None
    with torch.inference_mode():
        while True:
            msg = pickle.loads(conn.recv_bytes())
            if msg[0] == "shutdown":
                if graphs is not None:
                    graphs.release()
                break
            if msg[0] == "decode_setup":
                _, max_batch, width, capture = msg
                inputs = DecodeInputs(
                    max_batch, width, config.block_size, caches.pad_block, caches.pad_slot, device
                )
                graphs = DecodeGraphs(model, inputs, logits=False) if capture else None
                if graphs is not None:
                    graphs.capture()
                conn.send(("decode_ready",))
                continue
            for op, src, dst in msg[1]:
                getattr(caches, op)(src, dst)
            if msg[0] == "step":
                model(msg[2].to(device), msg[3].to(device))
                continue
            _, _, rows, graphed, tables_changed = msg
            assert inputs is not None, "a decode batch before decode_setup"
            broadcast_decode_inputs(group, inputs, rows, tables_changed)
            if graphed:
                graphs.replay(rows)
            else:
                model(inputs.input_ids(rows), inputs.metadata(rows))
    group.close()
