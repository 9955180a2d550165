"""The directory vLLM's suite runs in: the sdist's ``tests/`` with forge's shim over ``tests/utils.py`` and a
``conftest.py`` of its own over ``tests/conftest.py`` (vLLM's loads its GPU model runners), and a pytest.ini."""

from __future__ import annotations

from pathlib import Path

from benchmarks.conformance_vllm.source import extract_tests

HERE = Path(__file__).resolve().parent
VLLM_MARKERS = (
    "slow_test",
    "skip_global_cleanup",
    "core_model",
    "hybrid_model",
    "cpu_model",
    "cpu_test",
    "split",
    "distributed",
    "optional",
)
PYTEST_INI = "\n".join(
    [
        "[pytest]",
        "asyncio_mode = strict",
        "asyncio_default_fixture_loop_scope = function",
        "markers =",
        *(f"    {m}" for m in VLLM_MARKERS),
        "",
    ]
)
CONFTEST = '''"""forge's stand-in for vLLM's tests/conftest.py: its --optional switch (optional tests are skipped)."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "optional" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="need --optional option to run"))
'''


def prepare(archive: Path, into: Path) -> Path:
    """``into`` laid out for a run (emptied first); returns it."""
    extract_tests(archive, into)
    (into / "tests" / "utils.py").write_text((HERE / "shim_utils.py").read_text())
    (into / "tests" / "conftest.py").write_text(CONFTEST)
    (into / "pytest.ini").write_text(PYTEST_INI)
    return into
