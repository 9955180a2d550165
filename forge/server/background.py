"""A uvicorn server on a background thread (tests, benchmarks, notebooks)."""

from __future__ import annotations

import threading
import time
from types import TracebackType

from fastapi import FastAPI

from forge.server.launch import ForgeServer, uvicorn_config


class BackgroundServer:
    """``with BackgroundServer(app) as s: s.url`` — binds 127.0.0.1 on a free port by default;
    the app's connection limits and its drain on ``stop`` are those of ``serve``."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 60.0) -> None:
        self.app = app
        self.timeout_s = timeout_s
        state = app.state.forge
        config = uvicorn_config(app, state.settings, host=host, port=port, log_level="warning")
        self.server = ForgeServer(config, state.drain)
        app.state.shutdown.exit_server = self.server.request_exit
        self.thread = threading.Thread(target=self.server.run, name="forge-uvicorn", daemon=True)
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + self.timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        sockets = [s for srv in self.server.servers for s in srv.sockets]
        self.port = int(sockets[0].getsockname()[1])
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(self.timeout_s)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
