"""The state directory's disk layer: every write of ``/v1/files`` and ``/v1/batches`` goes through
``Disk``, and a failed write (a full disk, a read-only or vanished state dir) is answered 507 or
503 in OpenAI's error shape, never a 500.

``Disk.write`` puts a file in place whole or not at all (written to a temporary name, then
renamed). ``Disk.append`` adds checksummed lines (``<crc32 hex> <text>``); ``Disk.lines`` reads
back only the lines whose checksum holds, so a line torn by a stop mid-write, or damaged on
disk, is skipped rather than trusted."""

from __future__ import annotations

import errno
import os
import uuid
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from forge.server.protocol import APIError

FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class Disk:
    """The one seam between the stores and the file system (tests fill the disk by patching it)."""

    @staticmethod
    def write(path: Path, data: bytes) -> None:
        """``data`` at ``path`` whole or not at all (a temporary file renamed over it)."""
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def append(path: Path, texts: Iterable[str]) -> None:
        """Each of ``texts`` (one line each, no newline in it) as a checksummed line at the end of ``path``."""
        data = "".join(f"{zlib.crc32(t.encode()):08x} {t}\n" for t in texts).encode()
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a torn last line: end it, not the next one
                data = b"\n" + data
            view = memoryview(data)
            while view:  # a short write goes on where it stopped
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    @staticmethod
    def lines(path: Path) -> Iterator[str]:
        """The texts ``append`` wrote to ``path`` whose checksum holds (none when it is missing)."""
        if not path.exists():
            return
        for raw in path.read_bytes().split(b"\n"):
            crc, _, text = raw.partition(b" ")
            if len(crc) == 8 and f"{zlib.crc32(text):08x}".encode() == crc:
                yield text.decode("utf-8", "replace")


def storage_error(exc: OSError) -> APIError:
    """507 when the disk is full, else 503: the state dir cannot be written or read."""
    if exc.errno in FULL:
        return APIError(
            "the server's storage is full; retry later", 507, "insufficient_storage", code="insufficient_storage"
        )
    return APIError("the server's storage is unavailable; retry later", 503, "service_unavailable")


@contextmanager
def storage_errors() -> Iterator[None]:
    """Turn an ``OSError`` raised inside into ``storage_error``'s answer."""
    try:
        yield
    except OSError as exc:
        raise storage_error(exc) from exc
