"""docs/extending.md is real: its toy runner and toy policy, written into a directory of their own
exactly as the page gives them (one Python file + one YAML each), pass the project's ruff and mypy,
load the way a user's component does (the file on ``PYTHONPATH``, the YAML on ``hydra.searchpath``)
and do what the page says, through its own commands and its own Python example."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from forge import LLM, SamplingParams
from forge.config import ConfigError, compose_config

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "extending.md"
FILES = ["echo_runner.py", "conf/runner/echo.yaml", "longest_first.py", "conf/scheduler/longest_first.yaml"]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def block_named(name: str) -> str:
    """The block whose first line is ``# <name>`` (a file of the user's directory)."""
    found = [b for lang in ("python", "yaml") for b in blocks(lang) if b.startswith(f"# {name}\n")]
    assert len(found) == 1, f"docs/extending.md gives {len(found)} blocks for {name}"
    return found[0]


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``my_forge/`` with the page's four files, as a user writes them; the cwd is its parent."""
    for name in FILES:
        path = tmp_path / "my_forge" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block_named(name))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "my_forge"))
    return tmp_path / "my_forge"


@pytest.mark.parametrize("name", ["echo_runner.py", "longest_first.py"])
def test_the_page_components_pass_ruff_and_mypy(user_dir: Path, name: str) -> None:
    config = str(ROOT / "pyproject.toml")
    path = str(user_dir / name)
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", config, path], capture_output=True)
    assert ruff.returncode == 0, ruff.stdout.decode()
    mypy = subprocess.run([sys.executable, "-m", "mypy", "--config-file", config, path], cwd=ROOT, capture_output=True)
    assert mypy.returncode == 0, mypy.stdout.decode()


def test_the_page_python_example_runs_the_echo_runner(user_dir: Path) -> None:
    (example,) = blocks("python")[2:]  # the two component files, then the example
    exec(compile(example, "docs/extending.md", "exec"), {})  # it asserts the echoed tokens itself
    llm = LLM("hydra.searchpath=[file://my_forge/conf]", "runner=echo", "model=synthetic", "clock=simulated")
    assert type(llm.engine.runner).__name__ == "EchoRunner"
    refused = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, logprobs=1))
    assert refused[0].finish_reason == "error"  # a field the runner cannot give: refused, not ignored


def test_the_policy_serves_the_longest_prompt_first(user_dir: Path) -> None:
    llm = LLM(
        "hydra.searchpath=[file://my_forge/conf]", "scheduler=longest_first", "model=synthetic", "engine.max_num_seqs=1"
    )
    assert type(llm.engine.scheduler.policy).__name__ == "LongestFirst"
    prompts = [[1] * 3, [1] * 9, [1] * 5]
    first_seen: list[int] = []
    for delta in llm.stream(prompts, SamplingParams(max_tokens=2, ignore_eos=True)):
        if delta.index not in first_seen:
            first_seen.append(delta.index)
    assert first_seen == [1, 2, 0]  # one at a time (max_num_seqs=1), longest prompt first


@pytest.mark.parametrize("command", [line for b in blocks("bash") for line in b.strip().splitlines()])
def test_the_page_commands_run(user_dir: Path, command: str) -> None:
    """Each documented ``forge run`` line, run as written from the directory holding ``my_forge/``
    (``forge`` as ``python -m forge.cli``, so that this checkout's forge answers)."""
    env_part, tool, *args = shlex.split(command)
    assert env_part == "PYTHONPATH=my_forge" and tool == "forge" and args[0] == "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(["my_forge", str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", "forge.cli", *args, "report=false", "progress=false"],
        cwd=user_dir.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "run directory:" in proc.stdout + proc.stderr


def test_a_runner_of_ones_own_refuses_tensor_parallel(user_dir: Path) -> None:
    with pytest.raises(ConfigError, match="do not combine"):
        compose_config(["hydra.searchpath=[file://my_forge/conf]", "runner=echo", "engine.tensor_parallel_size=2"])
