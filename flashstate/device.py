"""The engine's device (`resolve_device`), and host → device uploads that never wait for it (`upload`).

`torch.tensor(data, device="cuda")` copies out of pageable memory and synchronises with the stream: the
host waits until every kernel already queued on it has run. Under async scheduling, and beside a host
restore's copies, that is a whole step. `upload` goes through page-locked memory instead (torch's caching
host allocator keeps the buffer until the copy has run), so the host returns at once."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def resolve_device(name: str) -> torch.device:
    """`auto`: cuda when present, else cpu. ValueError (one line for the CLI) for a device this process
    cannot use."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"--device {name!r}: {e}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise ValueError(f"--device {name}: {why} (torch {torch.__version__}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return device


def upload(data: list | np.ndarray, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """`data` as a `dtype` tensor on `device`; on CUDA, copied asynchronously on the current stream."""
    device = torch.device(device)
    host = (
        torch.from_numpy(data).to(dtype) if isinstance(data, np.ndarray) else torch.tensor(data, dtype=dtype)
    )
    if device.type != "cuda":
        return host.to(device)
    if host.numel() == 0:
        return torch.empty(host.shape, dtype=dtype, device=device)
    return host.pin_memory().to(device, non_blocking=True)
