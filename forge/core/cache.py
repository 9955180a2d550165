"""Where forge keeps what it fetches or compiles: fetched model files, compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "FORGE_CACHE_DIR"


def cache_dir(override: str | None = None) -> Path:
    """Where fetched model files live: ``override``, ``$FORGE_CACHE_DIR``, or ``~/.cache/forge``."""
    return Path(override or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "forge").expanduser()
