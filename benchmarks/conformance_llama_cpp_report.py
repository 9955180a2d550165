"""``conformance-llama-cpp.{md,csv,json}``: llama.cpp's server tests against forge, by class."""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.conformance_llama_cpp_classes import CLASSES, Rule, Verdict, counts, unused_rules
from benchmarks.machine import cpu_model

STEM = "conformance-llama-cpp"
ORDER = {k: i for i, k in enumerate(("forge-bug", "model-specific", "vendor-only", "skipped", "pass"))}


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    return f"working tree on top of {head}" if git("status", "--porcelain", "--untracked-files=no") else head


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()}, Python {platform.python_version()}"


def cell(text: str, limit: int = 160) -> str:
    """One line of a Markdown table cell."""
    one = " ".join(text.split())
    one = one if len(one) <= limit else one[: limit - 1] + "…"
    return one.replace("|", "\\|")


def row(v: Verdict) -> str:
    failure = cell(v.message) + (f" (forge: {cell(v.answers[0], 120)})" if v.answers else "")
    return f"| `{cell(v.nodeid, 200)}` | {v.outcome} | {v.klass} | {cell(v.reason)} | {failure} |"


def by_file(verdicts: Sequence[Verdict]) -> dict[str, dict[str, int]]:
    files: dict[str, list[Verdict]] = {}
    for v in verdicts:
        files.setdefault(v.nodeid.split("::")[0], []).append(v)
    return {f: counts(vs) for f, vs in sorted(files.items())}


def header(run: Mapping[str, Any], total: int) -> list[str]:
    return [
        "# llama.cpp's server tests against forge serve",
        "",
        f"Command: `{run['command']}` (from the repository root). Commit: {commit()}. Machine: {machine()}, "
        f"load average {run['load']:.1f} before / {run['load_after']:.1f} after; {run['wall_s'] / 60:.1f} min wall.",
        f"Suite: llama.cpp's `tools/server/tests/unit` as vendored in {run['sdist']}, {total} tests; forge serves "
        f"`{run['model']}` in place of each test's llama-server (`benchmarks/conformance_llama_cpp_adapter.py`).",
        "Classes: `pass`; `skipped` (by the suite itself); `forge-bug`; `vendor-only` (llama.cpp behaviour forge does "
        "not claim); `model-specific` (needs llama.cpp's test models or their exact output). Rules: "
        "`benchmarks/conformance_llama_cpp.toml` and the launch's `UNMAPPED` options; a failure no rule classes, "
        "and any 5xx or traceback in forge's log during a test, is a `forge-bug`.",
        "",
    ]


def markdown(verdicts: Sequence[Verdict], rules: Sequence[Rule], run: Mapping[str, Any]) -> str:
    total = counts(verdicts)
    lines = [*header(run, len(verdicts)), "## Counts", "", "| class | tests |", "|---|---|"]
    lines += [f"| {k} | {n} |" for k, n in total.items()] + [f"| total | {len(verdicts)} |", "", "## By file", ""]
    lines += ["| file | " + " | ".join(CLASSES) + " |", "|---" * (len(CLASSES) + 1) + "|"]
    lines += [f"| {f} | " + " | ".join(str(c[k]) for k in CLASSES) + " |" for f, c in by_file(verdicts).items()]
    lines += ["", "## Every test that did not pass", "", "| test | outcome | class | reason | failure |"]
    rest = sorted((v for v in verdicts if v.klass != "pass"), key=lambda v: (ORDER[v.klass], v.nodeid))
    lines += ["|---|---|---|---|---|", *(row(v) for v in rest)]
    stale = unused_rules(verdicts, rules)
    lines += ["", "## Rules that classed nothing in this run", ""]
    lines += [f"- `{r.tests}` ({r.klass}): {r.reason}" for r in stale] or ["None."]
    return "\n".join(lines) + "\n"


def write_reports(verdicts: Sequence[Verdict], rules: Sequence[Rule], run: Mapping[str, Any], stem: Path) -> None:
    """``stem`` + ``.md``, ``.csv`` and ``.json``."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(markdown(verdicts, rules, run))
    with stem.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["test", "outcome", "class", "reason", "failure", "refused requests"])
        writer.writerows([v.nodeid, v.outcome, v.klass, v.reason, v.message, "\n".join(v.answers)] for v in verdicts)
    doc: dict[str, Any] = {"run": {**run, "commit": commit(), "machine": machine()}, "counts": counts(verdicts)}
    doc["tests"] = [asdict(v) for v in verdicts]
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
