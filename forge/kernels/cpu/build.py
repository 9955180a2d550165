"""Compile C sources with the machine's compiler into a shared library cached outside the
repository, for ``ctypes``. Imports no torch (the synthetic model's kernel loads without it).

A library is built on first use into ``<cache>/kernels/`` (``$FORGE_CACHE_DIR`` or ``~/.cache/forge``,
as for model files), under a name keyed by its sources, their flags, the compiler's version and the
CPU's feature flags, so a cache shared between machines never hands one CPU another's binary.
``$CC`` picks the compiler."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from forge.core.cache import cache_dir


class NativeKernelsUnavailable(RuntimeError):
    """The C kernels could not be built or loaded here; the message says why."""


def compiler() -> str:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise NativeKernelsUnavailable(f"no C compiler: {cc!r} is not on PATH (install gcc, or set $CC)")
    return cc


def cpu_flags_line() -> str:
    """``/proc/cpuinfo``'s flags line (or what ``platform`` says of the CPU where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def shared_library(
    name: str, sources: Mapping[Path, tuple[str, ...]], compile_flags: tuple[str, ...], link: tuple[str, ...]
) -> Path:
    """The path of library ``name`` built from ``sources`` (each with its own extra compile flags),
    compiled with ``compile_flags`` and linked with ``link`` (flags, then libraries), building it
    if the cache lacks it; raises ``NativeKernelsUnavailable``."""
    cc = compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    parts = [f"{path.name}\0{' '.join(flags)}\0{path.read_text()}" for path, flags in sources.items()]
    parts += [" ".join(compile_flags + link), version, cpu_flags_line()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"{name}_{key}.so"
    if not target.exists():
        _compile(cc, sources, compile_flags, link, target)
    return target


def _compile(
    cc: str,
    sources: Mapping[Path, tuple[str, ...]],
    compile_flags: tuple[str, ...],
    link: tuple[str, ...],
    target: Path,
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [str(Path(tmp) / f"{path.name}.o") for path in sources]
        lib = Path(tmp) / target.name
        commands = [
            [cc, *compile_flags, *flags, "-c", str(path), "-o", obj]
            for (path, flags), obj in zip(sources.items(), objects, strict=True)
        ]
        link_flags = [f for f in link if not f.startswith("-l")]
        libs = [f for f in link if f.startswith("-l")]
        for cmd in [*commands, [cc, *link_flags, *objects, "-o", str(lib), *libs]]:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                failed = " ".join(cmd)
                raise NativeKernelsUnavailable(f"building the C kernels failed ({failed}):\n{done.stderr.strip()}")
        os.replace(lib, target)  # atomic: a concurrent build of the same key is harmless
