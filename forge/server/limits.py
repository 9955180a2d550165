"""Connection-level limits: how long a request's headers and body may take to arrive, how
large the body may be and how deeply it may nest (``server.header_timeout_s``,
``server.body_timeout_s``, ``server.max_body_bytes``, ``server.max_json_nesting``).

``BodyLimits`` is ASGI middleware: it reads the whole body before the app sees the request
(413 as soon as the declared or received size passes the limit, 408 when the body is not
complete in time, 400 when it nests too deep) and replays it, so no handler ever parses an
oversized or overdeep body or waits on a client that stopped sending. ``header_timeout_protocol``
is uvicorn's h11 protocol with a deadline on each request's headers (uvicorn has none: a client
sending one header byte at a time would hold its connection forever), and an answer in OpenAI's
error shape to a request that is not valid HTTP (uvicorn's is plain text)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from forge.server.errors import error_response
from forge.server.nesting import body_nesting_error
from forge.server.protocol import APIError

_CLOSE = {"Connection": "close"}
_INLINE_BYTES = 1 << 16  # bodies up to this size are measured on the event loop, larger ones on a thread


class BodyLimits:
    """Reads each HTTP request's body whole, within ``timeout_s`` and ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float, max_nesting: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.max_nesting = max_nesting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reject(self._too_large(), scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                first = await self._read(receive)
        except TimeoutError:
            err = APIError(
                f"the request body did not arrive within {self.timeout_s:g} s (server.body_timeout_s)",
                408,
                code="request_timeout",
                headers=_CLOSE,
            )
            await self._reject(err, scope, receive, send)
            return
        except _TooLarge:
            await self._reject(self._too_large(), scope, receive, send)
            return
        too_deep = await self._nesting_error(scope, first)
        if too_deep is not None:
            await error_response(too_deep)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return first
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> Message:
        """The body as one message (or the disconnect that ended it)."""
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            parts.append(chunk)
            if not message.get("more_body", False):
                return {"type": "http.request", "body": b"".join(parts), "more_body": False}

    async def _nesting_error(self, scope: Scope, message: Message) -> APIError | None:
        """The 400 for a body nested past ``max_nesting``: any body, whatever its declared type
        (``/generate`` reads every body as JSON), but a multipart upload's (a file's lines are
        checked where they are read)."""
        body: bytes = message.get("body", b"")
        if message["type"] != "http.request" or not body or _header(scope, b"content-type").startswith(b"multipart/"):
            return None
        if len(body) <= _INLINE_BYTES:
            return body_nesting_error(body, self.max_nesting)
        return await asyncio.to_thread(body_nesting_error, body, self.max_nesting)

    def _too_large(self) -> APIError:
        return APIError(
            f"the request body is larger than {self.max_bytes} bytes (server.max_body_bytes)",
            413,
            code="request_too_large",
            headers=_CLOSE,
        )

    @staticmethod
    async def _reject(err: APIError, scope: Scope, receive: Receive, send: Send) -> None:
        # ``Connection: close``: the rest of an unread body is never read.
        await error_response(err)(scope, receive, send)


class _TooLarge(Exception):
    pass


def _header(scope: Scope, name: bytes) -> bytes:
    """The first ``name`` header's value, lower case (b"" if absent)."""
    return next((value.lower() for key, value in scope["headers"] if key == name), b"")


def _content_length(scope: Scope) -> int | None:
    try:
        return int(_header(scope, b"content-length"))
    except ValueError:
        return None


class HeaderTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are not complete
    ``header_timeout_s`` after the connection opened or the request's first byte arrived."""

    header_timeout_s: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _waiting_for_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])

    def _watch_headers(self) -> None:
        """A deadline while a request has begun but its headers are incomplete (and from the
        moment a connection opens); none while idle between requests (keep-alive covers that)."""
        fresh = self.cycle is None and self.conn.their_state is h11.IDLE
        if fresh or self._waiting_for_headers():
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_timed_out)
        else:
            self._stop_header_timer()

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request that is not valid HTTP, in OpenAI's error shape."""
        error = APIError("the request is not valid HTTP", code="invalid_http")
        body = json.dumps(error.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        head = h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
        for event in (head, h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info("closing a connection whose request headers took over %g s", self.header_timeout_s)
            self.transport.close()


def header_timeout_protocol(header_timeout_s: float) -> type[HeaderTimeoutH11]:
    """The protocol class for ``uvicorn.Config(http=...)`` with this header deadline."""
    return type("HeaderTimeoutH11", (HeaderTimeoutH11,), {"header_timeout_s": header_timeout_s})
