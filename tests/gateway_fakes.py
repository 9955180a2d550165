"""A fake ``forge serve`` backend for the gateway's tests: it answers ``/health`` and ``/metrics`` (an idle
server's figures and a KV cache of ``block_size`` × ``num_gpu_blocks`` tokens) and holds every completion
open until ``release()``, so that a test decides how long a request stays in flight. With ``count_held`` its
``forge:num_requests_waiting`` is the completions it holds; with ``health_delay_s`` its ``/health`` answers late."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

IDLE_METRICS = """# TYPE forge:num_requests_running gauge
forge:num_requests_running{model_name="fake"} 0.0
forge:num_requests_waiting{model_name="fake"} 0.0
forge:kv_cache_usage_perc{model_name="fake"} 0.0
forge:cache_config_info{block_size="16",model_name="fake",num_gpu_blocks="64"} 1.0
"""


class HeldBackend:
    """A backend on 127.0.0.1 (a uvicorn thread) whose completions end only when ``release()`` is called."""

    def __init__(self, health_delay_s: float = 0.0, count_held: bool = False) -> None:
        self.released = threading.Event()
        self.health_delay_s = health_delay_s
        self.count_held = count_held
        self.held = 0
        app = FastAPI()
        app.add_api_route("/health", self._health, methods=["GET"])
        app.add_api_route("/metrics", self._metrics, methods=["GET"])
        app.add_api_route("/v1/completions", self._complete, methods=["POST"])
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def start(self) -> HeldBackend:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the fake backend did not start"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def release(self) -> None:
        self.released.set()

    def stop(self) -> None:
        self.release()
        self.server.should_exit = True
        self.thread.join(30)

    async def _health(self) -> Response:
        await asyncio.sleep(self.health_delay_s)
        return Response(status_code=200)

    async def _metrics(self) -> Response:
        if not self.count_held:
            return PlainTextResponse(IDLE_METRICS)
        waiting = f'forge:num_requests_waiting{{model_name="fake"}} {float(self.held)}'
        return PlainTextResponse(re.sub(r"^forge:num_requests_waiting.*$", waiting, IDLE_METRICS, flags=re.M))

    async def _held(self) -> None:
        self.held += 1
        try:
            while not self.released.is_set():
                await asyncio.sleep(0.02)
        finally:
            self.held -= 1

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        chunk = {"object": "text_completion", "model": "fake", "choices": [{"index": 0, "text": "x"}]}
        if not body.get("stream"):
            await self._held()
            return JSONResponse(chunk)

        async def events() -> AsyncIterator[bytes]:
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            await self._held()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


@contextmanager
def held_backends(n: int) -> Iterator[list[HeldBackend]]:
    """``n`` fake backends, released and stopped on exit."""
    with ExitStack() as stack:
        fakes = []
        for _ in range(n):
            fake = HeldBackend().start()
            stack.callback(fake.stop)
            fakes.append(fake)
        yield fakes
