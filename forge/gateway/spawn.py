"""``forge route --spawn N``: N local ``forge serve`` backends on loopback ports, stopped on exit."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

_PORT = re.compile(r"running on http://127\.0\.0\.1:(\d+)")


def _lines(stream: IO[str], out: queue.Queue[str]) -> None:
    for line in stream:
        out.put(line)


def _port(proc: subprocess.Popen[str], lines: queue.Queue[str], deadline: float) -> int:
    """The port the child says it listens on (uvicorn's startup line); RuntimeError if it exits first."""
    tail: list[str] = []
    while time.monotonic() < deadline:
        if proc.poll() is not None and lines.empty():
            break
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        tail = [*tail[-4:], line.strip()]
        m = _PORT.search(line)
        if m:
            return int(m.group(1))
    last = next((t for t in reversed(tail) if t), "no output")
    raise RuntimeError(f"a forge child did not start ({last})")


def _start(cmd: Sequence[str], cwd: str | None = None) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    """``cmd`` started with its stderr read line by line into a queue (by a daemon thread)."""
    proc = subprocess.Popen(list(cmd), cwd=cwd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stderr, lines), daemon=True).start()
    return proc, lines


@contextmanager
def gateway(args: Sequence[str], timeout_s: float = 300.0, cwd: str | None = None) -> Iterator[str]:
    """``forge route ARGS --port 0`` in a child process (binding 127.0.0.1); its base URL. Stopped on exit
    (SIGINT: it stops the backends it spawned itself)."""
    proc, lines = _start([sys.executable, "-m", "forge.cli", "route", "--port", "0", *args], cwd)
    try:
        yield f"http://127.0.0.1:{_port(proc, lines, time.monotonic() + timeout_s)}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class Spawned:
    url: str
    process: subprocess.Popen[str]


@contextmanager
def spawned(n: int, overrides: Sequence[str], timeout_s: float = 300.0) -> Iterator[list[Spawned]]:
    """``n`` ``forge serve`` children (``overrides`` given to each, port 0 on 127.0.0.1), stopped on exit."""
    cmd = [sys.executable, "-m", "forge.cli", "serve", *overrides, "server.host=127.0.0.1", "server.port=0"]
    procs: list[subprocess.Popen[str]] = []
    try:
        waits = []
        for _ in range(n):
            proc, lines = _start(cmd)
            procs.append(proc)
            waits.append(lines)
        deadline = time.monotonic() + timeout_s
        yield [Spawned(f"http://127.0.0.1:{_port(p, q, deadline)}", p) for p, q in zip(procs, waits, strict=True)]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
