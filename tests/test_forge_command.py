"""The ``forge`` command (``forge.cli:main``, pyproject's ``[project.scripts]``) run as a subprocess:
``forge run``, ``forge serve`` with vLLM's flags, ``forge report``, ``forge sweep``, ``forge bench``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from forge.cli import main, serve_overrides
from forge.config import ConfigError
from tests.server_helpers import server_process

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["model=synthetic", "clock=simulated", "workload.num_requests=4", "progress=false"]


def forge(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forge.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_the_console_script_is_forge_cli_main() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"forge": "forge.cli:main"}
    module, _, attr = scripts["forge"].partition(":")
    assert getattr(sys.modules[module], attr) is main


def test_a_run_records_forges_commit_not_the_working_directorys(tmp_path: Path) -> None:
    """Run from another git checkout: summary.json's commit is forge's own checkout's."""
    project = tmp_path / "project"
    project.mkdir()
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=project, check=True)
    theirs = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=project, capture_output=True, text=True)
    ours = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "forge.cli", "run", *QUICK, f"hydra.run.dir={run_dir}"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    commit = json.loads((run_dir / "summary.json").read_text())["commit"]
    assert commit.removesuffix("+dirty") == ours.stdout.strip() != theirs.stdout.strip()


def test_forge_run_writes_a_run_directory_and_forge_report_rewrites_its_report(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = forge("run", *QUICK, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TTFT" in proc.stdout and f"run directory: {run_dir}" in proc.stdout
    assert json.loads((run_dir / "summary.json").read_text())["num_requests"] == 4
    assert (run_dir / "run.log").exists()  # the same job name as python run.py
    (run_dir / "report.md").unlink()
    (run_dir / "kv_usage.png").unlink()
    proc = forge("report", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run_dir / "report.md").exists() and (run_dir / "kv_usage.png").exists()


def test_forge_report_refuses_a_directory_without_a_run(tmp_path: Path) -> None:
    proc = forge("report", str(tmp_path))
    assert proc.returncode != 0
    assert "not a run directory" in proc.stderr and "Traceback" not in proc.stderr


def test_forge_run_sweep_then_forge_sweep_rewrites_the_sweep_report(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = forge(
        "run", "-m", *QUICK, "report=false", "seed=0,1", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={sweep_dir}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep_dir / "sweep_report.md").unlink()
    proc = forge("sweep", str(sweep_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "seed" in (sweep_dir / "sweep_report.md").read_text()


def test_a_config_error_is_one_line_and_exit_2() -> None:
    proc = forge("run", *QUICK, "engine.max_num_seqs=0")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "config error: engine.max_num_seqs must be >= 1, got 0"


def test_an_unknown_command_prints_the_usage_and_exits_2() -> None:
    proc = forge("serv")
    assert proc.returncode == 2
    assert "forge serve" in proc.stderr


def test_serve_maps_vllm_flags_onto_the_config() -> None:
    overrides, key = serve_overrides(
        [
            "synthetic",
            "--port",
            "9001",
            "--host=0.0.0.0",
            "--max-num-seqs",
            "8",
            "--max-model-len",
            "256",
            "--block-size",
            "32",
            "--tensor-parallel-size",
            "2",
            "--served-model-name",
            "my-model",
            "--api-key",
            "sk-1",
            "scheduler=priority",
        ]
    )
    assert overrides == [
        "mode=serve",
        "model=synthetic",
        "server.port=9001",
        "server.host=0.0.0.0",
        "engine.max_num_seqs=8",
        "engine.max_model_len=256",
        "kvcache.block_size=32",
        "engine.tensor_parallel_size=2",
        "server.served_model_name=my-model",
        "scheduler=priority",
    ]
    assert key == "sk-1"


def test_serve_refuses_an_unknown_flag_and_a_flag_without_value() -> None:
    with pytest.raises(ConfigError, match="--gpu-memory-utilization"):
        serve_overrides(["--gpu-memory-utilization", "0.9"])
    with pytest.raises(ConfigError, match="--port needs a value"):
        serve_overrides(["--port"])


def test_forge_serve_cfg_job_shows_the_mapped_config() -> None:
    proc = forge("serve", "synthetic", "--port", "9001", "--max-num-seqs", "3", "--block-size", "8", "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mode: serve" in proc.stdout
    assert re.search(r"port: 9001\b", proc.stdout) and re.search(r"max_num_seqs: 3\b", proc.stdout)
    assert re.search(r"block_size: 8\b", proc.stdout)


def test_forge_serve_starts_a_server_that_wants_the_api_key(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "forge.cli", "serve", "synthetic", "--port", "0", "--api-key", "sk-test"]
    cmd += ["--served-model-name", "daily", f"hydra.run.dir={tmp_path}"]
    with server_process(cmd) as (_, port):
        url = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(url, timeout=30).status_code == 401
        models = httpx.get(url, headers={"Authorization": "Bearer sk-test"}, timeout=30).json()
        assert [card["id"] for card in models["data"]] == ["daily"]
        assert "sk-test" not in "".join(p.read_text() for p in tmp_path.rglob("*.yaml"))


def test_forge_bench_names_its_benchmarks() -> None:
    proc = forge("bench", "nope")
    assert proc.returncode != 0
    assert "forge bench {serve,startup,regress}" in proc.stderr
