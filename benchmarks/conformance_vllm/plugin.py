"""The pytest plugin the harness runs vLLM's suite with (``-p benchmarks.conformance_vllm.plugin``):
installs the ``vllm`` stand-ins (strict while a test runs) and writes one JSON line per test outcome
(and per module that failed to import) to the file named by ``FORGE_VLLM_SUITE_RESULTS``."""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.conformance_vllm.stub import Switch, install

RESULTS_ENV = "FORGE_VLLM_SUITE_RESULTS"


MESSAGE_CHARS = 600


def crash_line(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The failure's message (the exception's, on one line, at most MESSAGE_CHARS), or the skip's reason."""
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return " ".join(str(crash.message).split())[:MESSAGE_CHARS]
    text = [line for line in str(longrepr or "").splitlines() if line.startswith("E ")]
    return " ".join(" ".join(text).split())[:MESSAGE_CHARS]


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.switch = Switch()
        install(self.switch)

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        self.switch.strict = True
        try:
            return (yield)
        finally:
            self.switch.strict = False

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        failed_setup = report.when != "call" and report.outcome != "passed"
        if report.when == "call" or failed_setup:
            outcome = "error" if report.when != "call" and report.failed else report.outcome
            self.write(
                {"id": report.nodeid, "outcome": outcome, "phase": report.when, "message": crash_line(report)}
                | {"seconds": round(report.duration, 3)}
            )

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.write({"id": report.nodeid, "outcome": "error", "phase": "collect", "message": crash_line(report)})


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(RESULTS_ENV)
    if path:
        config.pluginmanager.register(Recorder(Path(path)), "forge-vllm-suite-recorder")
