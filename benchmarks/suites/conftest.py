"""What the suites' benchmark JSON records about the machine beyond pytest-benchmark's own
``machine_info``: the load average at the end of the run (``benchmarks/regress.py`` writes it into
the baseline, so a baseline saved on a busy machine says so)."""

from __future__ import annotations

import os
from typing import Any


def pytest_benchmark_update_machine_info(config: Any, machine_info: dict[str, Any]) -> None:
    machine_info["load_average"] = [round(x, 2) for x in os.getloadavg()]
