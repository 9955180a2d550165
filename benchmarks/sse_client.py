"""A lean HTTP/1.1 client for one streamed POST (server-sent events) on asyncio's own streams:
a benchmark client must spend little CPU per chunk, or its own event loop delays what it
measures (httpx costs milliseconds of CPU per streamed request). Plain ``http://`` only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPStatusError(Exception):
    """The server answered with a status other than 200."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:200]}")
        self.status = status


class SSEClient:
    """POSTs JSON to ``base_url`` and yields each SSE event's data (bytes, without ``data: ``);
    one connection per request (``Connection: close``), so nothing is shared between tasks."""

    def __init__(self, base_url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"SSEClient takes http://host:port URLs, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"Host: {parts.netloc}\r\nContent-Type: application/json\r\nConnection: close\r\n{extra}"

    async def stream(self, path: str, body: bytes) -> AsyncIterator[bytes]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            request = f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n"
            writer.write(request.encode("latin-1") + body)
            status_line = await reader.readline()
            fields = status_line.split()
            if len(fields) < 2:
                raise ConnectionError("the server closed the connection without a response")
            status = int(fields[1])
            chunked = False
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
            if status != 200:
                rest = b"".join([piece async for piece in _body(reader, chunked)])
                raise HTTPStatusError(status, rest.decode("utf-8", "replace"))
            buffer = b""
            async for piece in _body(reader, chunked):
                buffer += piece
                while (end := buffer.find(b"\n\n")) >= 0:
                    event, buffer = buffer[:end], buffer[end + 2 :]
                    if event.startswith(b"data: "):
                        yield event[6:]
        finally:
            writer.close()


async def _body(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[bytes]:
    """The response body as it arrives (de-chunked), until its end or the connection's."""
    if not chunked:
        while piece := await reader.read(65536):
            yield piece
        return
    while True:
        size_line = await reader.readline()
        if not size_line:
            return
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return
        yield await reader.readexactly(size)
        await reader.readexactly(2)  # the chunk's CRLF
