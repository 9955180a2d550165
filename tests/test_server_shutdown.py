"""POST /shutdown: only with the admin key (401 without a bearer key, 403 with any other key, an
API key included, and 403 for everyone on a server without an admin key); then the server drains
(503s, /health 503, in-flight requests finish), writes its metrics to the run directory and exits 0."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer
from tests.server_helpers import error_of, server_process

KEY = "sk-api-test"
ADMIN_KEY = "sk-admin-test"


def test_shutdown_drains_and_exits_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_ADMIN_KEY", ADMIN_KEY)  # the server process inherits it
    run_dir = tmp_path / "run"
    cmd = [
        *(sys.executable, "run.py", "mode=serve", "model=tiny", "server.port=0", f"server.api_keys=[{KEY}]"),
        *(f"server.state_dir={tmp_path / 'state'}", "server.shutdown_timeout_s=30", f"hydra.run.dir={run_dir}"),
    ]
    with server_process(cmd) as (proc, port):
        url = f"http://127.0.0.1:{port}"
        auth = {"Authorization": f"Bearer {KEY}"}
        body = {"model": "tiny", "prompt": "drain me", "max_tokens": 300, "ignore_eos": True, "stream": True}
        first_chunk = threading.Event()
        events: list[str] = []

        def stream() -> None:
            with httpx.stream("POST", url + "/v1/completions", json=body, headers=auth, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        first_chunk.set()

        assert error_of(httpx.post(url + "/shutdown"), 401)["code"] == "invalid_api_key"
        assert error_of(httpx.post(url + "/shutdown", headers=auth), 403)["type"] == "permission_error"
        client = threading.Thread(target=stream)
        client.start()
        assert first_chunk.wait(30)
        r = httpx.post(url + "/shutdown", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert r.status_code == 202 and r.json()["status"] == "shutting_down"
        deadline = time.monotonic() + 10
        while httpx.get(url + "/health").status_code != 503:
            assert time.monotonic() < deadline, "/health did not turn 503 while draining"
            time.sleep(0.02)
        refused = httpx.post(url + "/v1/completions", json={**body, "stream": False}, headers=auth)
        assert error_of(refused, 503)["code"] == "unavailable"
        client.join(60)
        assert proc.wait(timeout=60) == 0
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "length"  # drained, not aborted
    assert len([e for e in events[:-1] if json.loads(e)["choices"][0]["text"] is not None]) >= 1
    metrics = (run_dir / "server_metrics.prom").read_text()
    finished = re.findall(r'^forge:request_success_total\{[^}]*finished_reason="length"[^}]*\} (\S+)$', metrics, re.M)
    assert [float(x) for x in finished] == [1.0]
    assert not [p for p in run_dir.rglob("*") if p.is_file() and ADMIN_KEY in p.read_text(errors="replace")]


def test_shutdown_without_an_admin_key_is_forbidden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server with no admin key cannot be stopped over HTTP (anyone reaching it could), not
    even by a client holding an API key."""
    monkeypatch.delenv("FORGE_ADMIN_KEY", raising=False)
    cfg = compose_config(["model=tiny", f"server.state_dir={tmp_path}", f"server.api_keys=[{KEY}]"])
    app, _ = app_from_config(cfg, "tiny")
    with BackgroundServer(app) as s:
        assert error_of(httpx.post(s.url + "/shutdown"), 403)["type"] == "permission_error"
        api_key = {"Authorization": f"Bearer {KEY}"}
        assert error_of(httpx.post(s.url + "/shutdown", headers=api_key), 403)["type"] == "permission_error"
        assert error_of(httpx.get(s.url + "/shutdown"), 405)
        assert httpx.get(s.url + "/health").status_code == 200


def test_only_the_admin_key_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """server.admin_key: 401 without a bearer key, 403 with an API key or a wrong one; the admin key
    stops the server."""
    monkeypatch.delenv("FORGE_ADMIN_KEY", raising=False)
    overrides = [f"server.state_dir={tmp_path}", f"server.api_keys=[{KEY}]", f"server.admin_key={ADMIN_KEY}"]
    app, _ = app_from_config(compose_config(["model=tiny", *overrides]), "tiny")

    def shutdown(key: str) -> httpx.Response:
        return httpx.post(s.url + "/shutdown", headers={"Authorization": f"Bearer {key}"})

    with BackgroundServer(app) as s:
        assert error_of(httpx.post(s.url + "/shutdown"), 401)["type"] == "authentication_error"
        assert error_of(shutdown(KEY), 403)["code"] == "forbidden"
        assert error_of(shutdown(ADMIN_KEY + "x"), 403)["code"] == "forbidden"
        assert httpx.get(s.url + "/health").status_code == 200
        assert ADMIN_KEY not in repr(app.state.forge.settings)
        assert shutdown(ADMIN_KEY).status_code == 202
        s.thread.join(30)
        assert not s.thread.is_alive()
