"""A model's default sampling settings (vLLM's `--generation-config`): what a request that leaves a
setting unset gets.

    auto    the model directory's generation_config.json
    vllm    none: the API's own defaults
    FOLDER  that folder's generation_config.json

Read, as vLLM reads them: temperature, top_p, top_k, min_p, repetition_penalty, and max_new_tokens, which
becomes `max_tokens` (a cap: a request gets at most that many tokens, asked for or not).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FILE = "generation_config.json"
_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def generation_defaults(setting: str, model_dir: str | Path) -> dict[str, Any]:
    """Request-field name -> default. ValueError for a FOLDER without the file, or a file that is not a
    JSON object of sensible values."""
    if setting == "vllm":
        return {}
    folder = Path(model_dir if setting == "auto" else setting)
    path = folder / FILE
    if not path.is_file():
        if setting == "auto":
            return {}
        raise ValueError(f"generation_config: no {FILE} in {folder}")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"generation_config: {path} is not readable JSON ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"generation_config: {path} is not a JSON object")
    out = {}
    for key, name in _KEYS.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"generation_config: {key} in {path} must be a number, got {value!r}")
        out[name] = int(value) if name in ("top_k", "max_tokens") else float(value)
    return out
