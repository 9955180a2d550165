"""``forge route``: the gateway's command line.

    forge route --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 router=least_outstanding
    forge route --spawn 3 model=tiny router=prefix_aware          # three local backends, stopped on exit

Overrides ``router=<name>`` and ``router.<key>=<value>`` (and ``seed=``) configure the router; with
``--spawn N`` every other override is given to each spawned ``forge serve`` backend. ``--api-key`` (or
``FORGE_API_KEY``) is checked at the gateway; ``--backend-api-key`` (or ``FORGE_BACKEND_API_KEY``) is sent
to the backends instead of the client's own ``Authorization``."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from forge.config import ConfigError

if TYPE_CHECKING:
    from forge.gateway.backends import Backend
    from forge.gateway.proxy import GatewaySettings
    from forge.routers.base import Router


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="forge route", description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="router=NAME, router.KEY=VALUE; with --spawn, backend overrides")
    ap.add_argument("--backend", action="append", default=[], help="a backend's base URL (repeatable)")
    ap.add_argument("--spawn", type=int, default=0, help="start N local forge serve backends")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--api-key", action="append", default=[], help="a key clients must send (repeatable)")
    ap.add_argument("--backend-api-key", default=None)
    ap.add_argument("--health-interval", type=float, default=2.0, help="seconds between health checks (2)")
    return ap


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the router's overrides, the spawned backends' overrides)."""
    mine = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in ("router", "seed") or o.startswith("router.")]
    return mine, [o for o in overrides if o not in mine]


def bind(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, bound before anything starts (a port in use fails at once)."""
    if not 0 <= port < 65536:
        raise ConfigError(f"--port {port}: not a TCP port (0-65535)")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
    return sock


def main(argv: Sequence[str]) -> None:
    args = parser().parse_args(list(argv))
    from forge.gateway.backends import Backend, check_url

    router_overrides, backend_overrides = split_overrides(args.overrides)
    if args.spawn < 0:
        raise ConfigError(f"--spawn must be >= 0, got {args.spawn}")
    if not args.backend and not args.spawn:
        raise ConfigError("forge route needs backends: --backend URL (repeatable) or --spawn N")
    if backend_overrides and not args.spawn:
        raise ConfigError(f"{backend_overrides[0]}: not a router setting (backend overrides need --spawn)")
    try:
        urls = [check_url(u) for u in args.backend]
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if any(not key.strip() for key in args.api_key):
        raise ConfigError("--api-key: an empty key would let every client in")
    router = make_router(router_overrides)
    sock = bind(args.host, args.port)
    keys = tuple(args.api_key) or tuple(k for k in [os.environ.get("FORGE_API_KEY")] if k)
    backend_key = args.backend_api_key or os.environ.get("FORGE_BACKEND_API_KEY")
    from forge.gateway.proxy import GatewaySettings
    from forge.gateway.spawn import spawned

    settings = GatewaySettings(api_keys=keys, backend_api_key=backend_key, health_interval_s=args.health_interval)
    with spawned(args.spawn, backend_overrides) as local:
        backends = [Backend(u) for u in [*urls, *(s.url for s in local)]]
        run(sock, backends, router, settings)


def make_router(overrides: Sequence[str]) -> Router:
    from forge.config import compose_config
    from forge.engine.make import make

    cfg = compose_config(list(overrides))
    router: Router = make("router", cfg.router)
    return router


def run(sock: socket.socket, backends: list[Backend], router: Router, settings: GatewaySettings) -> None:
    import uvicorn

    from forge.gateway.proxy import Gateway, build_gateway_app

    app = build_gateway_app(Gateway(backends, router, settings))
    host, port = sock.getsockname()[:2]
    print(f"forge route: {len(backends)} backend(s), router {type(router).__name__}", file=sys.stderr)
    print(f"forge route running on http://{host}:{port}", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    server.run(sockets=[sock])
