"""vLLM 0.33.0's test sources: the sdist from PyPI, checked against a pinned sha256, of which only
``tests/`` is extracted (into a fresh directory per run)."""

from __future__ import annotations

import shutil
import tarfile
import urllib.request
from pathlib import Path

from benchmarks.digest import sha256_of
from forge.core.cache import cache_dir

VERSION = "0.33.0"
URL = (
    "https://pypi.org/packages/packages/f7/25/aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/"
    f"vllm-{VERSION}.tar.gz"
)
SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
SUITE = "tests/entrypoints/openai"


def sdist(cache: Path | None = None, url: str = URL, sha256: str = SHA256) -> Path:
    """The sdist, downloaded once into the cache (a temporary file renamed only after its sha256 matched)."""
    target = (cache or cache_dir() / "vllm-suite") / url.rsplit("/", 1)[-1]
    if target.exists() and sha256_of(target) == sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=120) as response, part.open("wb") as out:
        shutil.copyfileobj(response, out)
    got = sha256_of(part)
    if got != sha256:
        part.unlink()
        raise SystemExit(f"{url}: sha256 {got}, expected {sha256}")
    part.replace(target)
    return target


def extract_tests(archive: Path, into: Path) -> Path:
    """``tests/`` of the sdist (and nothing else) under ``into``, which is emptied first; returns ``into``."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")
            if inner.startswith("tests/") and (member.isfile() or member.isdir()):
                member.name = inner
                members.append(member)
        tar.extractall(into, members=members, filter="data")
    return into
