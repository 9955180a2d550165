"""Classes for llama.cpp's server tests run against forge: each test's outcome and why.

A test that passes is ``pass``; one pytest skipped is ``skipped`` (its own reason). A failure is
classed, in this order, by: an incident in forge's log during the test (5xx, traceback, exit:
``forge-bug`` whatever the test says), a llama-server option the launch cannot map
(``conformance_llama_cpp_launch.UNMAPPED``: its class and reason are in the message), the first rule
of ``conformance_llama_cpp.toml`` whose ``tests`` pattern (fnmatch on the test id) matches and whose
``match`` (a regex, if given) is found in the failure message or in the test's refused requests
(``answers``: ``POST /v1/completions -> 400 <forge's error message>``, one a line). Anything else is a ``forge-bug``
until a reviewer classes it: a new failure is never hidden by a rule written for another one."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from benchmarks.conformance_llama_cpp_launch import UNMAPPED_PREFIX

RULES_PATH = Path(__file__).with_name("conformance_llama_cpp.toml")
RULE_CLASSES = ("vendor-only", "model-specific")
CLASSES = ("pass", "skipped", "forge-bug", *RULE_CLASSES)
UNMAPPED_TAIL = re.compile(re.escape(UNMAPPED_PREFIX) + r" (?P<option>.*?) \[(?P<klass>[a-z-]+)\] (?P<reason>[^\n]*)")


@dataclass(frozen=True)
class Rule:
    """Tests (an fnmatch pattern over test ids) whose failure is of ``klass`` for ``reason``;
    ``match``: a regex the failure message must contain (``""``: any failure)."""

    tests: str
    klass: str
    reason: str
    match: str = ""

    def applies(self, nodeid: str, message: str) -> bool:
        return fnmatchcase(nodeid, self.tests) and (not self.match or re.search(self.match, message) is not None)


@dataclass(frozen=True)
class Verdict:
    nodeid: str
    outcome: str  # pytest's: passed, failed, error, skipped
    klass: str
    reason: str
    message: str
    answers: tuple[str, ...] = ()  # the test's refused requests (method path -> status message)
    source: str = ""  # what classed it: "incident", "unmapped", "rule N" (0-based, the file's order), "default"


def load_rules(path: Path = RULES_PATH) -> tuple[Rule, ...]:
    """The rules of a TOML file (``[[rule]]`` tables: tests, class, reason, optional match)."""
    data = tomllib.loads(path.read_text())
    rules = tuple(Rule(r["tests"], r["class"], r["reason"], r.get("match", "")) for r in data["rule"])
    for rule in rules:
        if rule.klass not in RULE_CLASSES or not rule.reason.strip():
            raise ValueError(f"{path}: rule {rule.tests!r}: class must be one of {RULE_CLASSES}, with a reason")
        re.compile(rule.match)
    return rules


def classify(result: Mapping[str, Any], rules: Sequence[Rule]) -> Verdict:
    """The class of one test's result (``results.json``'s entry: nodeid, outcome, message, incidents)."""
    nodeid, outcome, message = str(result["nodeid"]), str(result["outcome"]), str(result["message"])
    incidents = list(result.get("incidents", []))
    evidence = "\n".join([message, *result.get("answers", [])])

    def verdict(klass: str, reason: str, source: str) -> Verdict:
        return Verdict(nodeid, outcome, klass, reason, message, tuple(result.get("answers", [])), source)

    if incidents:
        return verdict("forge-bug", "forge's log during the test: " + "; ".join(incidents[:3]), "incident")
    if outcome in ("passed", "skipped"):
        return verdict("pass" if outcome == "passed" else "skipped", "" if outcome == "passed" else message, outcome)
    unmapped = UNMAPPED_TAIL.search(message)
    if unmapped:
        reason = f"needs llama-server's {unmapped['option']}: {unmapped['reason']}"
        return verdict(unmapped["klass"], reason, "unmapped")
    index = next((i for i, r in enumerate(rules) if r.applies(nodeid, evidence)), None)
    if index is not None:
        return verdict(rules[index].klass, rules[index].reason, f"rule {index}")
    return verdict("forge-bug", "no rule classes this failure", "default")


def unused_rules(verdicts: Iterable[Verdict], rules: Sequence[Rule]) -> list[Rule]:
    """Rules that classed no failure of this run (stale, or for tests the run did not select)."""
    used = {v.source for v in verdicts}
    return [r for i, r in enumerate(rules) if f"rule {i}" not in used]


def counts(verdicts: Iterable[Verdict]) -> dict[str, int]:
    found = [v.klass for v in verdicts]
    return {k: found.count(k) for k in CLASSES}
