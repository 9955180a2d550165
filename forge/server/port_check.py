"""``forge serve``'s check that its port can be bound, made before the model loads."""

from __future__ import annotations

import errno
import socket

from forge.core.errors import ENVIRONMENT_EXIT_CODE, CommandError


def check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` once (as uvicorn will, address reuse on) so that a port in use is one line
    before the model loads, not after; port 0 (any free port) needs no check."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            why = "is in use (another server?)" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
            raise CommandError(
                f"forge serve: {host}:{port} {why}; give another --port", ENVIRONMENT_EXIT_CODE
            ) from None
