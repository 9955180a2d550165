"""GET /version (vLLM's route): forge's package version and the commit it runs from; HEAD too."""

from __future__ import annotations

import subprocess
from importlib.metadata import version
from pathlib import Path

import httpx

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

FORGE_DIR = Path(__file__).resolve().parent.parent / "forge"


def test_version_names_the_package_version_and_the_commit(tmp_path: Path) -> None:
    cfg = compose_config(["model=tiny", f"server.state_dir={tmp_path}", "server.api_keys=[k]"])
    app, _ = app_from_config(cfg, "tiny")
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=FORGE_DIR
    ).stdout.strip()
    with BackgroundServer(app) as s:
        r = httpx.get(s.url + "/version")  # no key needed, as for /health
        assert r.status_code == 200 and set(r.json()) == {"version", "commit"}
        assert r.json()["version"] == version("forge")
        if head:  # run from a git checkout (CI is)
            assert r.json()["commit"] in (head, head + "+dirty")
        assert httpx.head(s.url + "/version").status_code == 200
        assert httpx.post(s.url + "/version").status_code == 405
