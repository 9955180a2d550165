"""Expected failures of every entry point, each in a fresh process: one line on stderr and the exit
status forge.errors documents (2: the command line or its input is wrong; 3: something outside
forge that the command needs is missing or refuses); ``FORGE_FULL_ERROR=1`` shows the traceback."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from forge.config import ConfigError, compose_config
from forge.core.errors import ENVIRONMENT_EXIT_CODE, INPUT_EXIT_CODE
from forge.llm import LLM
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-planted-3f9c1e"
FORGE = [sys.executable, "-m", "forge.cli"]


def run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    for name in ("FORGE_FULL_ERROR", "HYDRA_FULL_ERROR", "FORGE_API_KEY"):
        if name not in env:
            environ.pop(name, None)
    return subprocess.run(cmd, cwd=cwd, env=environ, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[str]:
    """A synthetic-model server on 127.0.0.1 that accepts ``KEY`` only."""
    app, _ = app_from_config(compose_config(["model=synthetic", f"server.api_keys=[{KEY}]"]), "synthetic")
    with BackgroundServer(app) as s:
        yield s.url


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something already listens on (127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# (case, command after `forge` or a module, exit status, text the line names)
BATCH = [sys.executable, "-m", "forge.batch"]
ENV = ENVIRONMENT_EXIT_CODE
BENCH_KEYED = [*FORGE, "bench", "serve", "--url", "{url}", "--api-key", KEY]
CASES = [
    ("run: no such model option", [*FORGE, "run", "model=tinyy"], INPUT_EXIT_CODE, "model=tinyy: no such option"),
    ("serve: port out of range (flag)", [*FORGE, "serve", "tiny", "--port", "99999"], INPUT_EXIT_CODE, "99999"),
    ("serve: port out of range (setting)", [*FORGE, "serve", "tiny", "server.port=99999"], INPUT_EXIT_CODE, "99999"),
    ("serve: port in use", [*FORGE, "serve", "tiny", "--port", "{busy}"], ENV, "is in use"),
    ("sweep: missing directory", [*FORGE, "sweep", "{tmp}/nope"], INPUT_EXIT_CODE, "is not a directory"),
    ("sweep: not a sweep", [*FORGE, "sweep", "{tmp}"], INPUT_EXIT_CODE, "is not a sweep directory"),
    ("report: not a run", [*FORGE, "report", "{tmp}"], INPUT_EXIT_CODE, "is not a run directory"),
    ("bench: no such benchmark", [*FORGE, "bench", "nope"], INPUT_EXIT_CODE, "usage: forge bench"),
    ("bench serve: unreachable", [*FORGE, "bench", "serve", "--url", "{dead}"], ENV, "cannot reach"),
    ("bench serve: no key", [*FORGE, "bench", "serve", "--url", "{url}"], ENV, "give --api-key KEY"),
    ("bench serve: wrong key", [*FORGE, "bench", "serve", "--url", "{url}", "--api-key", "x"], ENV, "not one it"),
    ("bench serve: bad --set", [*BENCH_KEYED, "--set", "workload.output_len.high=4"], INPUT_EXIT_CODE, "1 <= low"),
    ("batch: unknown model", [*BATCH, "{tmp}/in.jsonl", "{tmp}/o", "model=tinyy"], INPUT_EXIT_CODE, "no such option"),
    ("batch: missing input", [*BATCH, "{tmp}/nope.jsonl", "{tmp}/o"], INPUT_EXIT_CODE, "cannot read"),
]


@pytest.mark.parametrize(("case", "cmd", "status", "names"), CASES, ids=[c[0] for c in CASES])
def test_expected_failure_is_one_line(
    case: str, cmd: list[str], status: int, names: str, tmp_path: Path, keyed_server: str, busy_port: int
) -> None:
    (tmp_path / "in.jsonl").write_text("{}\n")
    values = {"tmp": str(tmp_path), "url": keyed_server, "dead": f"http://127.0.0.1:{closed_port()}"}
    values["busy"] = str(busy_port)
    proc = run([arg.format(**values) for arg in cmd], cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == status and len(lines) == 1, f"{case}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert names in lines[0] and "Traceback" not in proc.stderr


def test_full_error_shows_the_traceback(tmp_path: Path) -> None:
    proc = run([*FORGE, "sweep", str(tmp_path)], cwd=tmp_path, FORGE_FULL_ERROR="1")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "CommandError" in proc.stderr


def ray_cluster_on_this_machine() -> bool:
    """Whether some Ray cluster runs here (``address: auto`` would join it): then there is no case."""
    return subprocess.run(["pgrep", "-f", "gcs_server"], capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("ray") is None, reason="ray is not installed (the sweep extra)")
def test_ray_auto_without_a_cluster_is_one_line(tmp_path: Path) -> None:
    if ray_cluster_on_this_machine():
        pytest.skip("a Ray cluster runs on this machine: address=auto would join it")
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's sockets need a short path
    try:
        sweep = ["-m", "hydra/launcher=ray", "hydra.launcher.progress=false", "model=synthetic"]
        sweep += ["workload.num_requests=2", "scheduler=fcfs,sjf", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
        proc = run([sys.executable, str(ROOT / "run.py"), *sweep], cwd=tmp_path, RAY_TMPDIR=ray_tmp)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == ENVIRONMENT_EXIT_CODE and len(lines) == 1, proc.stderr[-3000:]
    assert "no Ray cluster running" in lines[0] and "hydra.launcher.address=null" in lines[0]


def test_llm_with_an_unknown_option_raises_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        LLM("model=tinyy")
    assert str(err.value).startswith("model=tinyy: no such option (options: ") and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^engine\.nope: not a setting"):
        LLM("engine.nope=1")


UNGUARDED = 'from forge.llm import LLM\n\nllm = LLM("model=tiny", "engine.tensor_parallel_size=2")\nprint("built")\n'


def test_tensor_parallel_spawn_from_an_unguarded_script_is_refused_at_once(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    proc = run([sys.executable, str(script)], cwd=tmp_path)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "built" not in proc.stdout
    assert "UnguardedMainError" in last and "unguarded.py:3" in last and 'if __name__ == "__main__":' in last


@pytest.mark.skipif(shutil.which("ray") is None, reason="ray is not installed (the sweep extra)")
def test_ray_local_cluster_binds_the_loopback(tmp_path: Path) -> None:
    """``hydra.launcher.address=null``: the sweep's own cluster, every Ray process on 127.0.0.1 (the
    addresses its logs name), stopped at the end."""
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        sweep = ["-m", "hydra/launcher=ray", "hydra.launcher.progress=false", "hydra.launcher.address=null"]
        sweep += ["model=synthetic", "clock=simulated", "workload.num_requests=2", "scheduler=fcfs,sjf"]
        proc = run(
            [sys.executable, str(ROOT / "run.py"), *sweep, f"hydra.sweep.dir={tmp_path}"], tmp_path, RAY_TMPDIR=ray_tmp
        )
        assert proc.returncode == 0 and proc.stdout.count("ran on Ray node") == 2, proc.stderr[-3000:]
        logs = Path(ray_tmp) / "ray" / "session_latest" / "logs"
        text = " ".join(p.read_text(errors="replace") for p in logs.rglob("*") if p.is_file())
        hosts = set(re.findall(r"\b(\d{1,3}(?:\.\d{1,3}){3}):\d+", text))
        assert hosts and hosts <= {"127.0.0.1", "0.0.0.0"}, hosts
        assert subprocess.run(["pgrep", "-f", ray_tmp], capture_output=True).returncode == 1  # none left
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
