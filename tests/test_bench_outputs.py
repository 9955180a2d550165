"""What commands write: every ``forge bench`` subcommand run with its default output place leaves the
checkout's ``git status`` as it was (benchmarks write under ``outputs/``), and an API key given to
``forge serve``, ``forge bench serve`` or a run's ``server.api_keys`` reaches no file that a run, a
sweep, a sweep report or a benchmark writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.child_server import child_server
from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-planted-7d41aa"
FORGE = [sys.executable, "-m", "forge.cli"]
SMALL = ["--num-prompts", "2", "--set", "workload.input_len.high=16", "workload.output_len.high=8"]


def forge(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FORGE_API_KEY", None)
    proc = subprocess.run([*FORGE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def git_status() -> list[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True)
    return sorted(out.stdout.decode().splitlines())


def written_dir(stdout: str, label: str) -> Path:
    """The directory a benchmark says it wrote (``results: DIR`` / ``report: DIR/README.md``)."""
    m = re.search(rf"^{label}: (.+)$", stdout, re.M)
    assert m, stdout[-2000:]
    path = Path(m.group(1).strip())
    path = path if path.is_absolute() else ROOT / path
    return path if path.is_dir() else path.parent


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[str]:
    app, _ = app_from_config(compose_config(["model=synthetic", f"server.api_keys=[{KEY}]"]), "synthetic")
    with BackgroundServer(app) as s:
        yield s.url


def holding_key(root: Path) -> list[str]:
    """Every file below ``root`` whose bytes contain ``KEY``."""
    return [str(p) for p in root.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]


def regress_json(path: Path) -> Path:
    """A pytest-benchmark JSON equal to the committed baseline (calibration 1 s), timed as the gate times."""
    base = json.loads((ROOT / "benchmarks/suites/baselines/baseline.json").read_text())
    rows = {"test_calibration_loop": 1.0, **base["benchmarks"]}
    opts = {"timer": "process_time", "disable_gc": True}
    data = {"benchmarks": [{"name": n, "options": opts, "stats": {"min": v}} for n, v in rows.items()]}
    path.write_text(json.dumps(data))
    return path


def test_every_bench_subcommand_with_defaults_leaves_the_checkout_clean(tmp_path: Path, keyed_server: str) -> None:
    before = git_status()
    written = []
    try:
        serve = forge("bench", "serve", "--url", keyed_server, "--api-key", KEY, *SMALL)
        written.append(written_dir(serve.stdout, "results"))
        startup = forge("bench", "startup", "--repeats", "1", "--no-server", "model=synthetic")
        written.append(written_dir(startup.stdout, "report"))
        regress = forge("bench", "regress", "--from-json", str(regress_json(tmp_path / "bench.json")))
        assert "PASS" in regress.stdout, regress.stdout[-2000:]
        assert git_status() == before
        for d in written:
            assert d.is_relative_to(ROOT / "outputs" / "bench"), d
            assert any(d.iterdir()) and not holding_key(d)
    finally:
        for d in written:
            shutil.rmtree(d, ignore_errors=True)


def test_a_planted_key_reaches_no_written_file(tmp_path: Path) -> None:
    serve_cmd = [*FORGE, "serve", "synthetic", "--port", "0", "--api-key", KEY, f"hydra.run.dir={tmp_path / 'serve'}"]
    with child_server(serve_cmd) as (_, port):
        url = f"http://127.0.0.1:{port}"
        forge("bench", "serve", "--url", url, f"--api-key={KEY}", *SMALL, "--output-dir", str(tmp_path / "b1"))
        forge("bench", "serve", "--url", url, "--api-key", KEY, *SMALL, "--output-dir", str(tmp_path / "b2"))
    assert (tmp_path / "b1" / "summary.json").is_file() and (tmp_path / "b2" / "report.md").is_file()
    keyed = ["model=synthetic", "workload.num_requests=2", f"server.api_keys=[{KEY}]"]
    forge("run", *keyed, f"hydra.run.dir={tmp_path / 'run'}")
    forge("run", "-m", *keyed, "scheduler=fcfs,sjf", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    forge("sweep", str(tmp_path / "sweep"))
    assert (tmp_path / "run" / "summary.json").is_file() and (tmp_path / "sweep" / "sweep_report.md").is_file()
    assert holding_key(tmp_path) == []
