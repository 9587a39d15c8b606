"""Reading what a run wrote (results, step traces) as written or gzipped, as benchmarks/results keeps them."""

from __future__ import annotations

import gzip
from pathlib import Path


def read_text(path: Path) -> str:
    """The text of `path`, gunzipped where its name ends in .gz."""
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
