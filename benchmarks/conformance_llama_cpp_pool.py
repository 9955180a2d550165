"""forge servers for the llama.cpp suite, kept running between tests that configure the same one.

Starting SmolLM2 takes about 10 s, and llama.cpp's tests start a server each (about 500 starts), so a
server is reused by the next test whose launch is the same (``Launch`` equality); at most ``keep``
run at once (the least recently used is stopped). Each server writes its log to its own file; after
every test ``incidents`` reads what the servers logged during it: a 5xx answer, a traceback, or a
server that exited is an incident, which the harness counts as a forge bug whatever the test says."""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from benchmarks.conformance_llama_cpp_launch import Launch

ROOT = Path(__file__).resolve().parent.parent
PORT_LINE = re.compile(r"running on http://127\.0\.0\.1:(\d+)")
INCIDENT = re.compile(r'HTTP/1\.[01]" 5\d\d[^\n]*|Traceback \(most recent call last\)')


@dataclass
class Pooled:
    """A running forge server, its port, its log file and how much of the log was read."""

    launch: Launch
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    log: IO[bytes]
    read_to: int = 0

    def new_log(self) -> str:
        """The log written since the last call."""
        with self.log_path.open("rb") as f:
            f.seek(self.read_to)
            data = f.read()
        self.read_to += len(data)
        return data.decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()


def _wait_for_port(proc: subprocess.Popen[bytes], log_path: Path, bound_s: float) -> int:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        m = PORT_LINE.search(text)
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"forge serve exited with {proc.returncode}: {text[-2000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"forge serve did not start within {bound_s} s")


@dataclass
class ServerPool:
    """The running servers, the least recently used first."""

    log_dir: Path
    keep: int = 2
    start_bound_s: float = 600.0
    servers: list[Pooled] = field(default_factory=list)
    started: int = 0

    def acquire(self, launch: Launch) -> Pooled:
        """A running server for ``launch``: the same one as before while it lives, else a new one."""
        for s in self.servers:
            if s.launch == launch and s.proc.poll() is None:
                self.servers.remove(s)
                self.servers.append(s)
                return s
        while len(self.servers) >= self.keep:
            self.servers.pop(0).stop()
        server = self._start(launch)
        self.servers.append(server)
        return server

    def _start(self, launch: Launch) -> Pooled:
        self.started += 1
        log_path = self.log_dir / f"forge-serve-{self.started:03d}.log"
        log = log_path.open("wb")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen(launch.command(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        server = Pooled(launch, proc, 0, log_path, log)
        try:
            server.port = _wait_for_port(proc, log_path, self.start_bound_s)
        except Exception:
            server.stop()
            raise
        server.new_log()  # the startup lines are not the first test's
        return server

    def incidents(self) -> list[str]:
        """What went wrong in the servers since the last call: 5xx answers, tracebacks, exits
        (an exited server leaves the pool)."""
        found: list[str] = []
        for s in list(self.servers):
            found += [f"server log: {m.group(0)}" for m in INCIDENT.finditer(s.new_log())]
            if s.proc.poll() is not None:
                found.append(f"forge serve exited with {s.proc.returncode}")
                self.servers.remove(s)
                s.stop()
        return found

    def close(self) -> None:
        while self.servers:
            self.servers.pop().stop()
