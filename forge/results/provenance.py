"""Where a result came from: the git commit of the code that produced it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit(repo: Path | None = None) -> str:
    """The short commit of the git checkout at ``repo`` (None: the working directory), with
    ``+dirty`` when tracked files differ from it; ``unknown`` when there is no checkout or no git."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, cwd=repo
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            cwd=repo,
        ).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
