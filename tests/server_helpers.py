"""Live servers for the server tests: one in a background thread per module, checked for leaks when it stops."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer


def start(overrides: list[str], model_name: str = "synthetic") -> BackgroundServer:
    app, _ = app_from_config(compose_config(overrides), model_name)
    return BackgroundServer(app).start()


@contextmanager
def serving(overrides: list[str], model_name: str = "synthetic") -> Iterator[BackgroundServer]:
    """A started server; on exit it is stopped and its engine must have leaked nothing."""
    server = start(overrides, model_name)
    try:
        yield server
    finally:
        server.stop()
    assert server.app.state.forge.engine.leak is None


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    """The body's OpenAI-shaped error, after checking the status."""
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err
