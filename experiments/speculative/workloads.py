"""Prompts for the speculative-decoding study, built from text that ships with Python (no downloads).

- input-grounded: ask the model to repeat a passage of a stdlib module's source verbatim;
- chat-like: open questions whose answers are not in the prompt.
"""

from __future__ import annotations

import inspect
import textwrap

QUESTIONS = [
    "What is a hash table and when would you use one?",
    "Give three tips for writing readable Python code.",
    "Explain the difference between a process and a thread.",
    "Why is the sky blue? Answer briefly.",
    "Write a short poem about the sea.",
    "What are the pros and cons of remote work?",
    "How does a binary search work?",
    "Suggest a name for a pet turtle and explain why.",
]


def passages(n: int, num_lines: int = 12) -> list[str]:
    """``n`` passages of ``num_lines`` source lines from stdlib modules."""
    import argparse
    import json
    import shlex

    out: list[str] = []
    for module in (textwrap, shlex, json.decoder, argparse):
        lines = [ln for ln in inspect.getsource(module).splitlines() if ln.strip()]
        for start in range(0, len(lines) - num_lines, num_lines * 3):
            out.append("\n".join(lines[start : start + num_lines]))
    return [out[i % len(out)] for i in range(n)]


def grounded_messages(n: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": "Repeat the following Python code exactly, with no comments:\n\n" + p}]
        for p in passages(n)
    ]


def chat_messages(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(n)]
