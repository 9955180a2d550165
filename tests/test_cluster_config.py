"""A cluster's bad settings are one-line config errors (exit status 2), and a router written as
docs/cluster.md shows, one file and one YAML outside the checkout, runs with no other edit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE = ["model=synthetic", "clock=simulated", "progress=false", "report=false", "workload.num_requests=6"]


def run_py(*overrides: str, run_dir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "run.py", *BASE, *overrides, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.replicas=0"], "cluster.replicas must be an integer >= 1, got 0"),
        (["router=fastest"], "router=fastest: no such option (options: least_kv, least_outstanding,"),
        (["cluster.replicas=2", "cluster.hardware=[a100]"], "cluster.hardware lists 1 entries for 2 replicas"),
        (
            ["cluster.replicas=2", "cluster.overrides=[{},{kvcache:{num_blocks:1}}]"],
            "workload: cluster replica 1: request req-000000 may need",
        ),
        (["cluster.replicas=2", "cluster.overrides=[{engine:{foo:1}},{}]"], "cluster replica 0: Key 'foo' not in"),
        (["router=power_of_two", "router.seed=x"], "router.seed='x': expected an integer"),
    ],
)
def test_a_bad_cluster_setting_is_one_line(overrides: list[str], message: str, tmp_path: Path) -> None:
    proc = run_py(*overrides, run_dir=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: ") and message in lines[0], proc.stderr


def doc_block(language: str, first_line: str) -> str:
    text = (ROOT / "docs" / "cluster.md").read_text()
    block = re.search(rf"```{language}\n{re.escape(first_line)}\n(.*?)```", text, re.S)
    assert block is not None, f"docs/cluster.md lost its {first_line} example"
    return block.group(1)


def test_the_documented_user_router_runs_with_no_other_edit(tmp_path: Path) -> None:
    (tmp_path / "my_routers").mkdir()
    (tmp_path / "my_routers" / "fewest_tokens.py").write_text(doc_block("python", "# my_routers/fewest_tokens.py"))
    (tmp_path / "my_conf" / "router").mkdir(parents=True)
    (tmp_path / "my_conf" / "router" / "fewest_tokens.yaml").write_text(
        doc_block("yaml", "# my_conf/router/fewest_tokens.yaml")
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    search = f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"
    run_dir = tmp_path / "run"
    proc = run_py(
        "cluster.replicas=3", "router=fewest_tokens", search, "workload.num_requests=30", run_dir=run_dir, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["router"] == "FewestTokens" and summary["num_requests"] == 30
    assert all(row["requests"] > 0 for row in summary["per_replica"])


def test_the_documented_user_router_passes_ruff_and_mypy(tmp_path: Path) -> None:
    path = tmp_path / "fewest_tokens.py"
    path.write_text(doc_block("python", "# my_routers/fewest_tokens.py"))
    config = str(ROOT / "pyproject.toml")
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", config, str(path)], capture_output=True)
    assert ruff.returncode == 0, ruff.stdout.decode()
    mypy = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", config, str(path)], cwd=ROOT, capture_output=True
    )
    assert mypy.returncode == 0, mypy.stdout.decode()


@pytest.mark.parametrize("cluster", [["cluster.replicas=2"], ["cluster=disaggregated"]])
def test_one_engine_entry_points_refuse_a_cluster(cluster: list[str], tmp_path: Path) -> None:
    from forge import LLM
    from forge.config import ConfigError

    with pytest.raises(ConfigError, match="forge serve and the LLM class run one engine"):
        LLM("model=synthetic", *cluster)
    proc = run_py("mode=serve", "clock=wall", "server.port=0", *cluster, run_dir=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "config error: cluster: forge serve and the LLM class run one engine" in lines[0], (
        proc.stderr
    )


def test_a_replica_override_may_swap_a_component(tmp_path: Path) -> None:
    """``cluster.overrides`` replaces a replica's scheduler by its ``_target_`` (as the run's own
    ``scheduler._target_`` would); instantiated as a nested config it was a config error
    ("Value 'SJF' is not a supported primitive type")."""
    from forge.cluster.run import build_cluster
    from forge.config import compose_config
    from forge.policies.fcfs import FCFS
    from forge.policies.sjf import SJF

    swap = "cluster.overrides=[{scheduler:{_target_:forge.policies.sjf.SJF}},{}]"
    cluster = build_cluster(compose_config([*BASE, "cluster.replicas=2", swap]))
    policies = [type(replica.engine.scheduler.policy) for replica in cluster.replicas]
    assert policies == [SJF, FCFS]
    proc = run_py("cluster.replicas=2", swap, run_dir=tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
