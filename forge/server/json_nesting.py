"""How deeply a JSON text nests, measured before it is parsed.

Python's ``json`` parser (and every recursive walk of what it returns: schema checks, grammar
building, template rendering) recurses once per level, so a body nested a few thousand levels
deep reaches the interpreter's recursion limit. ``check_nesting`` measures the text's depth
without recursion and without parsing it (string contents are skipped, so brackets inside strings
do not count) and refuses a text deeper than the limit before anything parses it."""

from __future__ import annotations

import re

import numpy as np

MAX_JSON_NESTING = 64  # server.max_json_nesting's default: far above any real schema or body
MAX_JSON_NESTING_CEILING = 100  # the most server.max_json_nesting may be (forge.server.nesting says why)

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # (unrolled: linear, ~30x faster on long strings)
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[ord("{")] = _DELTA[ord("[")] = 1
_DELTA[ord("}")] = _DELTA[ord("]")] = -1
_DELTA.setflags(write=False)


class NestingError(ValueError):
    """A JSON text nests deeper than allowed; ``depth`` is how deep it goes (at least)."""

    def __init__(self, what: str, depth: int, limit: int) -> None:
        super().__init__(f"{what} nests {depth} levels deep; at most {limit} are allowed")
        self.depth = depth
        self.limit = limit


def json_nesting(text: str | bytes) -> int:
    """The deepest bracket nesting of ``text`` (objects and arrays, outside strings); 0 for a
    scalar. Linear in the text's length; an unterminated string counts its brackets."""
    data = text.encode() if isinstance(text, str) else text
    if b"[" not in data and b"{" not in data:
        return 0
    stripped = _STRING.sub(b"", data)
    steps = _DELTA[np.frombuffer(stripped, dtype=np.uint8)].astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


def check_nesting(text: str | bytes, limit: int = MAX_JSON_NESTING, what: str = "the JSON body") -> None:
    """Raise ``NestingError`` when ``text`` nests deeper than ``limit``. A text with no more brackets
    than ``limit`` cannot nest past it: counted first, as that costs almost nothing."""
    opens = text.count("[") + text.count("{") if isinstance(text, str) else text.count(b"[") + text.count(b"{")
    if opens <= limit:
        return
    depth = json_nesting(text)
    if depth > limit:
        raise NestingError(what, depth, limit)


def value_nesting(value: object) -> int:
    """The nesting depth of an already parsed value (dicts and lists), walked without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[object] = list(item.values())
        elif isinstance(item, (list, tuple)):
            children = list(item)
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest
