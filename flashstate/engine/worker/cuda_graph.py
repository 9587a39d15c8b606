"""CUDA graphs for decode batches: one captured forward (model + logits) per padded batch size.

A graph reads its inputs from the static device buffers of a DecodeInputs (decode_inputs.py), which the
runner prepares and uploads before a replay. Rows past the batch are padding: they decode token 0 at
position 0 into the reserved pad block and pad slot (rows that belong to no pool), with no initial state,
so a replay never touches a live sequence's KV or state.

A model whose decode forward cannot be captured (an op that synchronises with the host, such as an MoE
router that looks up the selected experts) raises during capture; the runner then stays eager.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flashstate.engine.step_shapes import capture_sizes
from flashstate.engine.worker.decode_inputs import DecodeInputs
from flashstate.models.base import HybridForCausalLM


class DecodeGraphs:
    def __init__(self, model: HybridForCausalLM, inputs: DecodeInputs, logits: bool = True):
        """The graphs read `inputs`' device buffers: prepare and upload the batch there before a replay.
        Without `logits` (a tensor-parallel worker, which samples nothing) they stop at the hidden states."""
        self.model = model
        self.inputs = inputs
        self.logits = logits
        self.sizes = capture_sizes(inputs.max_batch)
        self.max_batch = self.sizes[-1]
        self.device = inputs.device
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, Tensor] = {}
        self._pool = None

    def _forward(self, bs: int) -> Tensor:
        hidden = self.model(self.inputs.input_ids(bs), self.inputs.metadata(bs))
        return self.model.compute_logits(hidden).float() if self.logits else hidden

    @torch.inference_mode()
    def capture(self) -> None:
        self.inputs.pad(0, self.max_batch)
        self.inputs.upload(self.max_batch)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):  # largest first: later graphs fit in its memory pool
                for _ in range(2):  # warm-up: autotuning and lazy initialisation happen outside capture
                    self._forward(bs)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                    self._logits[bs] = self._forward(bs)
                if self._pool is None:
                    self._pool = graph.pool()
                self._graphs[bs] = graph
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def release(self) -> None:
        """Free every graph and its pool. Graphs holding captured NCCL kernels must go before the
        communicator is destroyed, or NCCL's teardown waits forever (pytorch/pytorch#115388)."""
        torch.cuda.synchronize(self.device)
        for graph in self._graphs.values():
            graph.reset()
        self._graphs.clear()
        self._logits.clear()
        self._pool = None

    def fits(self, batch_size: int) -> bool:
        return bool(self._graphs) and batch_size <= self.max_batch

    def padded(self, batch_size: int) -> int:
        """The captured batch size a batch of batch_size sequences runs at."""
        return next(s for s in self.sizes if s >= max(batch_size, 1))

    def replay(self, n: int) -> Tensor:
        """Replay the graph for n sequences whose inputs are uploaded → logits [n, V] (fp32), or the hidden
        states without `logits`."""
        bs = self.padded(n)
        self._graphs[bs].replay()
        return self._logits[bs][:n]
