"""uvicorn set up from ``ServerSettings``, with a graceful drain on shutdown.

uvicorn's own shutdown waits ``timeout_graceful_shutdown`` for open responses and then cancels
their tasks, so a stream cut that way never gets its final chunk. ``ForgeServer`` first stops
accepting connections and runs the app's drain (in-flight requests get
``server.shutdown_timeout_s`` to finish, then each is aborted, so every stream sends a last
chunk with ``finish_reason="abort"`` and ``[DONE]``); only then does uvicorn's shutdown run.
SIGHUP (a closed terminal) takes the same path as SIGTERM and SIGINT, unless it is ignored
(``nohup``). Proxy headers are believed only from ``server.trusted_proxies`` (uvicorn's default
trusts them from 127.0.0.1, so any local client could choose its address)."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator

import uvicorn
from fastapi import FastAPI

from forge.server.limits import header_timeout_protocol
from forge.server.settings import ServerSettings

log = logging.getLogger("forge.server")
_AFTER_DRAIN_S = 5.0  # for the final chunks to be written once every request has ended


def uvicorn_config(
    app: FastAPI,
    settings: ServerSettings,
    host: str | None = None,
    port: int | None = None,
    log_level: str | None = None,
) -> uvicorn.Config:
    """The server's connection limits as uvicorn settings (host, port and log level default to
    ``settings``')."""
    return uvicorn.Config(
        app,
        host=settings.host if host is None else host,
        port=settings.port if port is None else port,
        log_level=settings.log_level if log_level is None else log_level,
        lifespan="on",
        http=header_timeout_protocol(settings.header_timeout_s),
        timeout_keep_alive=max(1, round(settings.keep_alive_timeout_s)),
        h11_max_incomplete_event_size=settings.max_header_bytes,
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=list(settings.trusted_proxies),
        timeout_graceful_shutdown=max(1, round(settings.shutdown_timeout_s + _AFTER_DRAIN_S)),
    )


class ForgeServer(uvicorn.Server):
    """``drain`` runs after the listening sockets close and before uvicorn's shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self.drain = drain

    def request_exit(self) -> None:
        """End the server as SIGTERM would (``POST /shutdown`` calls this once drained)."""
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's handlers (SIGINT, SIGTERM), and SIGHUP handled as they are. Inside uvicorn's
        context, so SIGHUP's own handler is back when uvicorn re-raises the signals it caught."""
        with super().capture_signals():
            main = threading.current_thread() is threading.main_thread()
            hangup = main and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN
            previous = signal.signal(signal.SIGHUP, self.handle_exit) if hangup else None
            try:
                yield
            finally:
                if hangup:
                    signal.signal(signal.SIGHUP, previous)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        if not self.force_exit:
            log.info("draining in-flight requests")
            await self.drain()
        await super().shutdown(sockets)
