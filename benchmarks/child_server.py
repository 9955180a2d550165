"""A forge server in a child process on a free port, for benchmarks that measure one from outside."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent


def _lines(stream: IO[str], out: queue.Queue[str]) -> None:
    for line in stream:
        out.put(line)


@contextmanager
def child_server(cmd: list[str], timeout_s: float = 300.0) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``cmd`` (a server started with port 0) run from the checkout, and the port it says it runs on;
    SystemExit if it exits or says nothing within ``timeout_s``. Stopped (terminated, then killed) on exit."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    logs: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stderr, logs), daemon=True).start()
    try:
        port = None
        while port is None:
            if time.perf_counter() - t0 > timeout_s or proc.poll() is not None:
                raise SystemExit(f"the server did not start: {' '.join(cmd)}")
            try:
                m = re.search(r"running on http://127\.0\.0\.1:(\d+)", logs.get(timeout=1))
            except queue.Empty:
                continue
            port = int(m.group(1)) if m else None
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
