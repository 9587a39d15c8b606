"""Fingerprints: what a cached artefact (a calibration fit, a host-tier state) was computed for."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import torch

from flashstate.spec.model_spec import ModelSpec


def layout_fingerprint(spec: ModelSpec, dtype: torch.dtype, **extra: object) -> str:
    """Architecture, every layer shape and the dtype (not the weights' values), plus `extra` settings."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "extra"}
    text = json.dumps({"spec": fields, "dtype": str(dtype), **extra}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu-{platform.machine()}-{torch.get_num_threads()}t"
