"""Prompts for the speculative-decoding study, built from text that ships with Python (no downloads).

- input-grounded (completion style, no chat template): the full source of a small stdlib function
  (textwrap, string, functools, shlex), shown twice, then the start of a third copy cut a few words
  into its docstring; a 135M model continues such a prompt verbatim (in-context copying), which is
  the case prompt lookup is made for. ``expected_continuation`` is the rest of the third copy, so
  the study can check how much of each output is a verbatim copy.
- chat-like: open questions through the chat template; their answers are not in the prompt.

A seed draws the order in which requests go through the functions (questions): a shuffle of the list
per seed, cycled, so each seed's case runs a different set and order of prompts (with fewer requests
than functions, a different subset).
"""

from __future__ import annotations

import functools
import inspect
import random
import shlex
import string
import textwrap
from collections.abc import Callable
from typing import Any

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

# Every stdlib function of these modules whose source is 400-1000 characters with a docstring
# (Python 3.11), in a fixed order; requests cycle through them.
FUNCTIONS: list[Callable[..., Any]] = [
    textwrap.wrap,
    string.capwords,
    functools.total_ordering,
    textwrap.fill,
    shlex.split,
    functools.wraps,
    textwrap.shorten,
    functools._c3_merge,  # type: ignore[attr-defined]
    textwrap.indent,
]
HEAD_WORDS = 2  # words of the docstring given after the opening quotes


def drawn(items: list[Any], n: int, seed: int) -> list[Any]:
    """``n`` items cycling through ``seed``'s shuffle of ``items``."""
    order = random.Random(seed).sample(items, len(items))
    return [order[i % len(order)] for i in range(n)]


def drawn_functions(n: int, seed: int) -> list[Callable[..., Any]]:
    """The functions whose sources make ``seed``'s ``n`` grounded prompts, in request order."""
    return drawn(FUNCTIONS, n, seed)


def source_passages(n: int, seed: int) -> list[str]:
    """``n`` function sources, cycling through ``seed``'s shuffle of ``FUNCTIONS``."""
    return [inspect.getsource(f) for f in drawn_functions(n, seed)]


def split_head(source: str) -> tuple[str, str]:
    """(head, rest): the head ends ``HEAD_WORDS`` words after the docstring's opening quotes."""
    i = source.index('"""') + 3
    for _ in range(HEAD_WORDS):
        i = source.index(" ", i + 1)
    return source[:i], source[i:]


def grounded_prompts(n: int, seed: int) -> tuple[list[str], list[str]]:
    """(prompts, expected continuations): source + blank line + source + blank line + head."""
    prompts, expected = [], []
    for src in source_passages(n, seed):
        head, rest = split_head(src)
        prompts.append(f"{src}\n\n{src}\n\n{head}")
        expected.append(rest)
    return prompts, expected


def chat_messages(n: int, seed: int) -> list[list[dict[str, str]]]:
    """``n`` one-question chats cycling through ``seed``'s shuffle of ``QUESTIONS``."""
    return [[{"role": "user", "content": q}] for q in drawn(QUESTIONS, n, seed)]


def copied_prefix(output: str, expected: str) -> int:
    """Characters of ``output`` that reproduce ``expected`` verbatim from the start."""
    n = 0
    for a, b in zip(output, expected, strict=False):
        if a != b:
            break
        n += 1
    return n
