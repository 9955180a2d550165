"""Requests that end with their client: a non-streamed completion, chat completion or embedding
whose client disconnects is cancelled, and its cancellation aborts its engine requests (their
sequences, ``n > 1`` forks, ``best_of`` samples and beams) before the engine's next step, as a
stream's does. vLLM's rule; without it a client that gives up leaves its work running."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from fastapi import Request
from fastapi.responses import Response

log = logging.getLogger("forge.server")

CLIENT_CLOSED = 499  # nginx's "client closed request": logged, never seen by the client


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body has been read whole before the route runs, so
    every later message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """``work``'s response; if the client disconnects first, ``work`` is cancelled (its engine
    requests aborted by its own cleanup) and the answer is a 499 nobody reads. A streamed
    response is returned as soon as it starts: the stream watches its client itself."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is itself cancelled (shutdown)
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        log.info("client disconnected from %s; its request was aborted", request.url.path)
        return Response(status_code=CLIENT_CLOSED)
    return task.result()
