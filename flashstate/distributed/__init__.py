"""Tensor parallelism over the GPUs (or CPU processes) of one host.

Rank 0 is the engine process: it owns the scheduler, the cache tree and sampling, and runs its share of
the model. Ranks 1..N-1 are worker processes it spawns (`worker.py`); before every forward it sends them
the batch (token ids, block tables, state slots, export positions) and the pending cache-tensor copies,
and all ranks run the same forward, summing each layer half's partial outputs with one all-reduce
(`group.py`). `shard_plan.py` says which share of every weight a rank holds.
"""
