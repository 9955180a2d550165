"""Live servers for the server tests: in a background thread (checked for leaks when it stops), or as a
separate process started from the command line."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

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


ROOT = Path(__file__).resolve().parent.parent


def _forward_lines(stream: IO[str], out: queue.Queue[str]) -> None:
    for line in stream:
        out.put(line)


def default_hangup() -> None:
    """In the server's child process: SIGHUP's default disposition, as a server started from a terminal
    has, even when the test run ignores it (``nohup python -m pytest``), which the server honours."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@contextmanager
def server_process(cmd: list[str], start_bound_s: float = 120.0) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Run ``cmd`` (a server on port 0) from the repository root until it logs the port it listens on;
    yields the process and the port, and kills the process on exit if it is still running."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=default_hangup
    )
    assert proc.stderr is not None
    logs: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_forward_lines, args=(proc.stderr, logs), daemon=True).start()
    try:
        port = None
        deadline = time.monotonic() + start_bound_s
        while port is None and time.monotonic() < deadline:
            try:
                m = re.search(r"running on http://127\.0\.0\.1:(\d+)", logs.get(timeout=5))
            except queue.Empty:
                assert proc.poll() is None, "the server exited"
                continue
            port = int(m.group(1)) if m else None
        assert port is not None, "the server did not start"
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
