"""How a test's outcome is classed. The rules themselves (data) are in ``rules.py``.

- ``pass``: the test passed against forge.
- ``skipped``: vLLM's suite skipped it itself (its reason is kept: a GPU count, an ``--optional`` test).
- ``vendor-only``: it exercises something of vLLM's that forge does not claim (a vLLM-only flag or
  field, LoRA, multimodal input, prompt embeds, the Responses API, vLLM's own Python classes).
- ``model-specific``: it needs the weights, tokens or template of the model it names (Qwen3's
  reasoning, a token id of Qwen's vocabulary, an answer SmolLM2-135M does not give).
- ``forge bug``: a failure no rule explains. A new failure lands here until someone reads it and
  either fixes forge or adds a rule with a reason a reviewer can check.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.conformance_vllm.stub import MARK

PASS, SKIPPED, VENDOR, MODEL, BUG = "pass", "skipped", "vendor-only", "model-specific", "forge bug"
CLASSES = (PASS, SKIPPED, VENDOR, MODEL, BUG)
SUITE_PREFIX = "tests/entrypoints/openai/"


@dataclass(frozen=True)
class Rule:
    """Tests whose id (relative to tests/entrypoints/openai/) matches ``pattern`` (fnmatch) and whose failure
    message matches ``message`` (a regex searched in it; "" matches any) are of class ``klass`` because ``reason``."""

    pattern: str
    klass: str
    reason: str
    message: str = ""

    def matches(self, test_id: str, message: str) -> bool:
        said = not self.message or re.search(self.message, message) is not None
        return fnmatch.fnmatchcase(test_id, self.pattern) and said


@dataclass(frozen=True)
class Verdict:
    test_id: str
    outcome: str
    klass: str
    reason: str
    message: str


def short_id(test_id: str) -> str:
    return test_id.removeprefix(SUITE_PREFIX)


def internal_called(message: str) -> str | None:
    """The vLLM name a test called (the stand-ins' failure), if that is what it failed on."""
    m = re.search(rf"{MARK}: the test calls vLLM's own ([\w.\[\]()]+)", message)
    if m:
        return m.group(1)
    m = re.search(r"Expected a BaseException type, but got '(vllm\.[\w.]+)'", message)
    if m:
        return m.group(1)
    m = re.search(r"<vllm\.(vllm\.[\w.]+) object|'(vllm\.[\w.]+)' object", message)  # a stand-in's object
    if m:
        return m.group(1) or m.group(2)
    return "a value of vLLM's" if "'_Meta'" in message else None


def classify(record: dict[str, Any], rules: Sequence[Rule]) -> Verdict:
    test_id, outcome, message = short_id(record["id"]), record["outcome"], record.get("message", "")
    if outcome == "passed":
        return Verdict(test_id, outcome, PASS, "", "")
    if outcome == "skipped":
        return Verdict(test_id, outcome, SKIPPED, f"vLLM's suite skips it: {message}", message)
    for rule in rules:
        if rule.matches(test_id, message):
            return Verdict(test_id, outcome, rule.klass, rule.reason, message)
    name = internal_called(message)
    if name is not None:
        reason = f"calls vLLM's own Python code ({name}) in-process, not the HTTP server"
        return Verdict(test_id, outcome, VENDOR, reason, message)
    return Verdict(test_id, outcome, BUG, "no rule explains this failure", message)


def worst(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per test id: a failure (say in teardown) outranks the pass recorded before it."""
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        seen = out.get(record["id"])
        if seen is None or rank[record["outcome"]] > rank[seen["outcome"]]:
            out[record["id"]] = record
    return list(out.values())


def verdicts(records: Iterable[dict[str, Any]], rules: Sequence[Rule]) -> list[Verdict]:
    return sorted((classify(r, rules) for r in worst(records)), key=lambda v: v.test_id)
