"""docs/kvcache.md's cache of your own is real: its file and YAML, put in a folder of their own and
loaded as a user's component is (on the import path, the folder on Hydra's search path), pass ruff and
mypy, run through ``python run.py`` as the doc's command says, and give ``kvcache=paged``'s tokens
(``model=synthetic`` reads its context back from the cache: lost or mixed blocks change them)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests
from forge.kvcache.base import KVCacheManager

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "kvcache.md"
SMALL = ["model=synthetic", "clock=simulated", "progress=false", "workload.num_requests=24"]


def block(lang: str, first_line: str = "") -> str:
    """The doc's first ``lang`` code block that starts with ``first_line`` (without that line)."""
    head = re.escape(first_line) + "\n" if first_line else ""
    found = re.search(rf"```{lang}\n{head}(.*?)```", DOC.read_text(), re.S)
    assert found is not None, f"docs/kvcache.md lost its {lang} block {first_line!r}"
    return found.group(1)


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """The doc's ``my_forge/`` folder: ``stack_kv.py`` and ``kvcache/stack.yaml``."""
    folder = tmp_path / "my_forge"
    (folder / "kvcache").mkdir(parents=True)
    (folder / "stack_kv.py").write_text(block("python", "# stack_kv.py"))
    (folder / "kvcache" / "stack.yaml").write_text(block("yaml", "# kvcache/stack.yaml"))
    return folder


def test_the_doc_cache_passes_ruff_and_mypy(user_dir: Path) -> None:
    path, config = str(user_dir / "stack_kv.py"), str(ROOT / "pyproject.toml")
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", config, path], capture_output=True)
    assert ruff.returncode == 0, ruff.stdout.decode()
    mypy = subprocess.run([sys.executable, "-m", "mypy", "--config-file", config, path], cwd=ROOT, capture_output=True)
    assert mypy.returncode == 0, mypy.stdout.decode()


def test_the_doc_command_runs_the_cache(user_dir: Path, tmp_path: Path) -> None:
    """The doc's shell command (its ``my_forge`` being this test's folder), with a run directory of its own."""
    command = " ".join(block("bash").replace("\\\n", " ").split())
    argv = shlex.split(command.replace("$PWD/my_forge", str(user_dir)))
    env_assign, argv = argv[0], argv[1:]
    assert env_assign == "PYTHONPATH=my_forge" and argv[:2] == ["python", "run.py"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(user_dir), str(ROOT)])}
    run_dir = tmp_path / "run"
    extra = ["progress=false", "report=false", "workload.num_requests=24", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run([sys.executable, *argv[1:], *extra], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_requests"] == 24 and summary["num_preemptions"] > 0  # 56 blocks: it preempts
    assert summary["total_output_tokens"] > 0


def _tokens(overrides: list[str]) -> tuple[dict[str, list[int]], KVCacheManager]:
    cfg = compose_config([*SMALL, *overrides])
    engine = build_engine(cfg)
    finals = engine.run(workload_requests(cfg, engine))
    return {rid: list(out.token_ids) for rid, out in finals.items()}, engine.scheduler.kv


def test_the_doc_cache_gives_the_paged_caches_tokens(user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(user_dir))
    mine, kv = _tokens([f"hydra.searchpath=[file://{user_dir}]", "kvcache=stack"])
    paged, _ = _tokens(["kvcache.num_blocks=64"])
    assert type(kv).__name__ == "StackKV" and kv.num_blocks == 64 - 8  # the YAML's headroom reached it
    assert len(mine) == 24 and mine == paged
