"""A model path in the config (``model.path``, ``drafter.model.path``), checked before anything loads
(``forge.config.validate`` turns a problem into a ``ConfigError``).

The path is resolved (``~`` expanded, relative to the working directory, links followed) and must be
what its loader reads: a regular file beginning with the GGUF magic for ``load_gguf``, a directory
holding ``config.json`` and a ``*.safetensors`` file for ``load_safetensors``. forge has no directory
that models must live in (a path is the operator's choice, as a path on vLLM's command line is), so a
path is not refused for where it points, only for not being a model of the kind asked for; nothing of
a file that is not one is read beyond its first four bytes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

GGUF_MAGIC = b"GGUF"
# the loader a model node's _target_ names -> what its path must be
_GGUF_LOADERS = ("forge.models.gguf_loader.load_gguf",)
_SAFETENSORS_LOADERS = ("forge.models.safetensors_loader.load_safetensors",)


def _gguf_problem(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot open it ({exc.strerror})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a GGUF file (not a regular file)"
        head = os.read(fd, len(GGUF_MAGIC))
    finally:
        os.close(fd)
    return None if head == GGUF_MAGIC else "not a GGUF file (it does not begin with GGUF)"


def _safetensors_problem(path: Path) -> str | None:
    if not path.is_dir():
        return "not a model directory (expected a Hugging Face directory with config.json and *.safetensors)"
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        return "not a model directory (it lacks config.json or a *.safetensors file)"
    return None


def path_problem(target: str, raw: str) -> str | None:
    """What is wrong with ``raw`` as the path of a model loaded by ``target`` (None: nothing, or a
    loader whose path is not checked here)."""
    if target not in _GGUF_LOADERS and target not in _SAFETENSORS_LOADERS:
        return None
    path = Path(raw).expanduser()
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return f"no such file or directory ({path.absolute()})"
    shown = "" if str(resolved) == raw else f" ({resolved})"
    problem = _gguf_problem(resolved) if target in _GGUF_LOADERS else _safetensors_problem(resolved)
    return None if problem is None else problem + shown
