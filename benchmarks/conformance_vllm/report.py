"""The table of a run: ``conformance-vllm.md`` (counts by class, by file, and every test that did not pass
with its class and reason), ``conformance-vllm.csv`` (every test) and ``conformance-vllm.json``."""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.conformance_vllm.classify import CLASSES, PASS, Verdict

STEM = "conformance-vllm"
MESSAGE_CHARS = 300  # of each failure's message in the CSV and JSON (200 in the Markdown)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def by_file(verdicts: Sequence[Verdict]) -> list[str]:
    counts: dict[str, Counter[str]] = {}
    for v in verdicts:
        counts.setdefault(v.test_id.split("::")[0], Counter())[v.klass] += 1
    lines = ["| file | " + " | ".join(CLASSES) + " |", "|---|" + "---:|" * len(CLASSES)]
    lines += [f"| {f} | " + " | ".join(str(c[k]) for k in CLASSES) + " |" for f, c in sorted(counts.items())]
    return lines


def markdown(verdicts: Sequence[Verdict], meta: dict[str, Any], not_run: Sequence[tuple[str, str]] = ()) -> str:
    totals = Counter(v.klass for v in verdicts)
    lines = ["# vLLM's OpenAI-server tests against forge serve", "", "```", meta["command"], "```", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "command"]
    lines += ["", "## Tests by class", "", "| class | tests |", "|---|---:|"]
    lines += [f"| {k} | {totals[k]} |" for k in CLASSES] + [f"| total | {len(verdicts)} |", ""]
    lines += ["## By file", "", *by_file(verdicts), ""]
    if not_run:
        lines += ["## Not run (deselected by the harness)", "", "| test | why |", "|---|---|"]
        lines += [f"| {cell(test)} | {cell(why)} |" for test, why in not_run] + [""]
    lines += ["## Every test that did not pass", "", "| test | outcome | class | reason | message |"]
    lines += ["|---|---|---|---|---|"]
    lines += [
        f"| {cell(v.test_id)} | {v.outcome} | {v.klass} | {cell(v.reason)} | {cell(v.message[:200])} |"
        for v in verdicts
        if v.klass != PASS
    ]
    return "\n".join([*lines, ""])


def write(
    out_dir: Path, verdicts: Sequence[Verdict], meta: dict[str, Any], not_run: Sequence[tuple[str, str]] = ()
) -> Path:
    """The three files under ``out_dir``; returns the Markdown's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [asdict(v) | {"message": v.message[:MESSAGE_CHARS]} for v in verdicts]
    with (out_dir / f"{STEM}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["test_id"])
        writer.writeheader()
        writer.writerows(rows)
    counts = dict(Counter(v.klass for v in verdicts))
    body = {**meta, "counts": counts, "not_run": [{"test": t, "why": w} for t, w in not_run], "tests": rows}
    (out_dir / f"{STEM}.json").write_text(json.dumps(body, indent=1) + "\n")
    path = out_dir / f"{STEM}.md"
    path.write_text(markdown(verdicts, meta, not_run))
    return path
