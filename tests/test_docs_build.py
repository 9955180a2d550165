"""The documentation site builds with ``mkdocs build --strict`` (a broken link or anchor, a docstring
reference to a module that moved, any warning fails), and a page not yet listed in mkdocs.yml's ``nav``
does not break it. Skipped only where mkdocs is not installed (the ``dev`` extra installs it)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_build_strict_with_an_unlisted_page(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install -e .[dev]")
    # A copy of the site's sources (forge linked in, for the API pages), plus a page no nav lists.
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "forge").symlink_to(ROOT / "forge", target_is_directory=True)
    (tmp_path / "docs" / "unlisted-page.md").write_text("# Not in nav\n\nSee [Serving](serving.md#limits).\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    site = tmp_path / "site"
    assert (site / "unlisted-page" / "index.html").exists()
    api = (site / "api" / "llm" / "index.html").read_text()
    assert 'id="forge.llm.LLM.generate"' in api  # the API pages are generated from the docstrings
