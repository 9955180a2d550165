"""How benchmark reports name the machine they ran on."""

from __future__ import annotations

import subprocess


def cpu_model(default: str = "?") -> str:
    """``lscpu``'s model name, or ``default`` where there is none."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return default
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), default)
