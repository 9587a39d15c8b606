"""Rank 0's side of tensor parallelism: starts the worker processes, keeps them in step, stops them.

    driver = TensorParallelDriver(config, model_dir, device)    # validates the split, spawns ranks 1..N-1
    model = load_model(..., shard=driver.shard); driver.group.attach(model)
    budget = driver.agree_on_budget(own_budget)                  # the smallest rank's
    caches = driver.start(model, caches, num_blocks, num_slots)  # workers allocate the same pools
    driver.model(input_ids, meta)                                # broadcast, then the local forward
    driver.decode(inputs, rows, graphed, tables_changed)         # before a decode batch (ModelRunner)

A decode batch sends no tensors through the pipe: the workers keep DecodeInputs buffers (and decode
graphs) like rank 0's, and rank 0's device buffers are broadcast into theirs by the collective group.

Cache-tensor copies made on rank 0 (copy-on-write blocks, slot copies) are queued and replayed by every
worker before its next forward, so each rank's share of the pools goes through the same writes in the
same order.

A worker never outlives rank 0: it exits when its pipe closes, and on Linux the kernel kills it when rank 0
ends, however it ends (PR_SET_PDEATHSIG, set by the worker; workers are started from a thread that lasts as
long as rank 0's process, since the kernel ties the request to the thread that started them).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import weakref
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import torch
from torch import Tensor

from flashstate.cache.cache_tensors import CacheTensors
from flashstate.config import EngineConfig
from flashstate.distributed.group import (
    TPGroup,
    bind_host,
    broadcast_decode_inputs,
    disable_nvls,
    master_store,
    rank_device,
    split_cpu_threads,
)
from flashstate.distributed.worker import run_worker
from flashstate.engine.worker.decode_inputs import DecodeInputs
from flashstate.layers.metadata import ForwardMetadata
from flashstate.lifeline import in_lasting_thread
from flashstate.models.base import HybridForCausalLM
from flashstate.models.shard_plan import Shard, TensorParallelError, shard_spec
from flashstate.spec.hf_config import spec_from_hf

JOIN_SECONDS = 10.0
DEATH_SECONDS = 2.0  # how long a failed step waits to learn whether a worker died
logger = logging.getLogger("flashstate")


class ParallelModel:
    """Rank 0's model: calling it sends the batch to the workers first; everything else is the local
    share's (`spec`, `compute_logits` over the replicated lm_head, `bind_caches`, ...)."""

    def __init__(self, local: HybridForCausalLM, driver: TensorParallelDriver):
        self.local = local
        self._driver = driver

    def __call__(self, input_ids: Tensor, meta: ForwardMetadata) -> Tensor:
        self._driver.broadcast(("step", self._driver.take_copies(), input_ids.cpu(), meta.to("cpu")))
        with self._driver.naming_dead_workers():
            return self.local(input_ids, meta)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)


class MirroredCaches:
    """Rank 0's cache tensors: copies apply here now and on every worker before its next forward."""

    def __init__(self, caches: CacheTensors, driver: TensorParallelDriver):
        self.caches = caches
        self.kv, self.states = caches.kv, caches.states
        self.pad_block, self.pad_slot = caches.pad_block, caches.pad_slot
        self._driver = driver

    def bind(self, model: Any) -> None:
        self.caches.bind(model)

    def copy_slot(self, src: int, dst: int) -> None:
        self.caches.copy_slot(src, dst)
        self._driver.copies.append(("copy_slot", src, dst))

    def copy_block(self, src: int, dst: int) -> None:
        self.caches.copy_block(src, dst)
        self._driver.copies.append(("copy_block", src, dst))


class TensorParallelDriver:
    def __init__(self, config: EngineConfig, model_dir: str, device: torch.device):
        n = config.tensor_parallel_size
        shard_spec(spec_from_hf(model_dir), n)  # a split that cannot work fails before any spawn
        if device.type == "cuda":
            base = device.index or 0
            if torch.cuda.device_count() < base + n:
                raise TensorParallelError(
                    f"tensor_parallel_size {n} on {device} needs GPUs {base}..{base + n - 1}; "
                    f"{torch.cuda.device_count()} visible"
                )
            disable_nvls()
        self.device = rank_device(device, 0)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.shard = Shard(0, n)
        self._threads = split_cpu_threads(self.device, n)
        self.copies: list[tuple[str, int, int]] = []
        self.host = bind_host(config.host)
        self.store = master_store(n, self.host)
        ctx = mp.get_context("spawn")
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self._groups: list[TPGroup] = []
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.conns, self._groups)
        for rank in range(1, n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=run_worker,
                args=(config, model_dir, rank, self.store.port, child, os.getpid()),
                name=f"flashstate-tp{rank}",
                daemon=True,
            )
            in_lasting_thread(proc.start)
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        try:
            for rank in range(1, n):
                self._expect(rank, "hello")
            self.group = TPGroup(self.store, 0, n, self.device, self.host)
            self._groups.append(self.group)
        except BaseException:
            self.shutdown()
            raise
        self.model: ParallelModel | None = None
        self._decode_ready = False

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def _expect(self, rank: int, kind: str) -> tuple:
        """The next message of worker `rank`, which must be `kind`; a worker's error or death raises."""
        conn, proc = self.conns[rank - 1], self.procs[rank - 1]
        while not conn.poll(0.2):
            if proc.exitcode is not None:
                raise RuntimeError(f"tensor-parallel worker {rank} exited with code {proc.exitcode}")
        try:
            msg = conn.recv()
        except EOFError as e:
            raise RuntimeError(f"tensor-parallel worker {rank} exited") from e
        if msg[0] == "error":
            raise RuntimeError(msg[1])
        if msg[0] != kind:
            raise RuntimeError(f"tensor-parallel worker {rank} sent {msg[0]!r}, expected {kind!r}")
        return msg

    def agree_on_budget(self, budget: int) -> int:
        """Wait for every worker's model; the cache budget every rank can hold (the smallest one)."""
        return min([budget] + [self._expect(rank, "ready")[1] for rank in range(1, len(self.procs) + 1)])

    def start(
        self, model: HybridForCausalLM, caches: CacheTensors, num_blocks: int, num_slots: int
    ) -> MirroredCaches:
        """Workers allocate the same pools (their heads' share); returns rank 0's mirrored caches."""
        self.broadcast(("plan", num_blocks, num_slots))
        self.model = ParallelModel(model, self)
        return MirroredCaches(caches, self)

    @property
    def local(self) -> HybridForCausalLM:
        assert self.model is not None, "start() first"
        return self.model.local

    def setup_decode(self, inputs: DecodeInputs, capture: bool) -> None:
        """The workers build decode buffers shaped like `inputs` and, with `capture`, capture their decode
        graphs now, together with rank 0 (the graphs' all-reduces pair up across ranks)."""
        self.broadcast(("decode_setup", inputs.max_batch, inputs.width, capture))
        self._decode_ready = False

    def decode(self, inputs: DecodeInputs, rows: int, graphed: bool, tables_changed: bool) -> None:
        if not self._decode_ready:
            for rank in range(1, len(self.procs) + 1):
                self._expect(rank, "decode_ready")
            self._decode_ready = True
        self.broadcast(("decode", self.take_copies(), rows, graphed, tables_changed))
        with self.naming_dead_workers():
            broadcast_decode_inputs(self.group, inputs, rows, tables_changed)

    @contextlib.contextmanager
    def naming_dead_workers(self):
        """A collective that fails raises the death of the worker behind it, if one died."""
        try:
            yield
        except RuntimeError as e:
            self.check_alive(wait=DEATH_SECONDS, cause=e)
            raise

    def take_copies(self) -> list[tuple[str, int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def broadcast(self, msg: tuple) -> None:
        # Plain pickle bytes: Connection.send would move tensors through shared memory.
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        self.check_alive()
        for conn in self.conns:
            try:
                conn.send_bytes(data)
            except OSError as e:
                self.check_alive(wait=DEATH_SECONDS, cause=e)
                raise

    def check_alive(self, wait: float = 0.0, cause: BaseException | None = None) -> None:
        """Raise if a worker has exited (waiting up to `wait` seconds for one that is going)."""
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs, strict=True), start=1):
            proc.join(wait)
            if proc.exitcode is not None:
                error = f"exit code {proc.exitcode}"
                with contextlib.suppress(EOFError, OSError):
                    if conn.poll():
                        error = conn.recv()[1]
                raise RuntimeError(f"tensor-parallel worker {rank} died: {error}") from cause

    def shutdown(self) -> None:
        """Stop the workers (idempotent); none is left running."""
        self._finalizer()
        torch.set_num_threads(self._threads)


def _stop(procs: list[BaseProcess], conns: list[Connection], groups: list[TPGroup]) -> None:
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.send_bytes(pickle.dumps(("shutdown",)))
    while groups:  # rank 0 tears its group down while the workers tear down theirs
        groups.pop().close()
    for proc in procs:
        proc.join(JOIN_SECONDS)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()
    if procs:
        codes = [p.exitcode for p in procs]
        logger.info("tensor-parallel workers stopped (exit codes %s)", codes)
