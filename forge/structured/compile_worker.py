"""One grammar compile worker: its loop (``serve``, run by ``python -m forge.structured.compile_pool FD``),
the memory and CPU limits it sets itself, and the server's handle on it (``WorkerProcess``: launch and
kill). Part of ``forge.structured.compile_pool``, whose ``CompilePool`` drives the workers."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from forge.structured.base import GrammarBuilder, GrammarError, GrammarTooLarge

_JOIN_S = 5.0


def _limit_address_space(extra_mb: int) -> None:
    """Cap this process's address space at its current size plus ``extra_mb``."""
    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no procfs: no memory cap (the time limit still holds)
        return
    limit = current + (extra_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _limit_cpu(seconds: float) -> None:
    """SIGXCPU (which ends the process) after ``seconds`` more CPU time: a compile whose server
    died (so nobody kills it at the timeout) still stops."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (int(usage.ru_utime + usage.ru_stime + seconds) + 1, hard))


def serve(conn: Connection) -> None:
    """A worker's loop: ``(builder, memory_mb, timeout_s)`` first, then ``(spec, max_states)`` in
    and ``(kind, artefact or message)`` out."""
    builder, memory_mb, timeout_s = conn.recv()
    assert isinstance(builder, GrammarBuilder)
    _limit_address_space(memory_mb)
    conn.send(("ready", None))
    while True:
        try:
            spec, max_states = conn.recv()
        except EOFError:
            return
        _limit_cpu(2 * timeout_s)
        try:
            reply: tuple[str, object] = ("ok", builder.build(spec, max_states))
        except GrammarTooLarge as exc:
            reply = ("too_large", str(exc))
        except GrammarError as exc:
            reply = ("error", str(exc))
        except MemoryError:
            reply = ("memory", "")
        conn.send(reply)


@dataclass(eq=False)
class WorkerProcess:
    process: subprocess.Popen[bytes]
    conn: Connection

    def kill(self) -> None:
        self.conn.close()
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # it was sent SIGKILL: the OS reaps it
            self.process.wait(_JOIN_S)

    @classmethod
    def launch(cls) -> WorkerProcess:
        """``python -m forge.structured.compile_pool FD``: a fresh interpreter that imports only
        what the builder needs (not the server's ``__main__``, as multiprocessing's spawn would)."""
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parents[2])  # this forge, whatever else is installed
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        fd = theirs.fileno()
        process = subprocess.Popen(
            [sys.executable, "-m", "forge.structured.compile_pool", str(fd)],
            pass_fds=(fd,),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        return cls(process, Connection(ours.detach()))
