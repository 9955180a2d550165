"""The "adding a policy" example of docs/architecture.md is real: it passes the project's ruff and mypy
and orders the waiting queue as it says (composed through Hydra like any conf/scheduler option)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.policies.base import Policy

ROOT = Path(__file__).resolve().parent.parent


def readme_example(tmp_path: Path) -> Path:
    text = (ROOT / "docs" / "architecture.md").read_text()
    code = re.search(r"```python\n# forge/policies/longest_first.py\n(.*?)```", text, re.S)
    assert code is not None, "docs/architecture.md lost its policy example"
    path = tmp_path / "longest_first.py"
    path.write_text(code.group(1))
    return path


def test_the_readme_policy_passes_ruff_and_mypy(tmp_path: Path) -> None:
    path = readme_example(tmp_path)
    config = str(ROOT / "pyproject.toml")
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", config, str(path)], capture_output=True)
    assert ruff.returncode == 0, ruff.stdout.decode()
    mypy = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", config, str(path)], cwd=ROOT, capture_output=True
    )
    assert mypy.returncode == 0, mypy.stdout.decode()


def test_the_readme_policy_orders_longest_first(tmp_path: Path) -> None:
    namespace: dict[str, object] = {}
    exec(compile(readme_example(tmp_path).read_text(), "longest_first.py", "exec"), namespace)
    policy = namespace["LongestFirst"]
    assert isinstance(policy, type) and issubclass(policy, Policy)
    params = SamplingParams(max_tokens=1)
    requests = [Request(f"r{n}", [1] * n, params, arrival_time=float(i)) for i, n in enumerate([3, 9, 5])]
    ordered = sorted(requests, key=policy().waiting_key)
    assert [r.request_id for r in ordered] == ["r9", "r5", "r3"]
