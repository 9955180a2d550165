"""Regexes for JSON strings: lengths, ``format`` and ``pattern``, each matching only JSON string
texts whose decoded value satisfies the keyword (a subset of them where noted).

``minLength`` / ``maxLength`` count code points, as each unit of ``STRING_INNER`` (a character or
a two-character escape) is one. ``FORMATS`` are written for what a validator checks (RFC 3339
dates with days valid in every year, so 29 February is left out; times with a zone; lowercase
UUIDs; dotted IPv4 without leading zeros; http(s) URIs; plain e-mail addresses).
``pattern`` is parsed with Python's regex parser (the one ``jsonschema`` matches with) and
written back as a regex over the JSON text that must match it whole (a subset of the strings
that contain a match): literals that JSON must escape are written escaped; classes keep only
characters that need no escape (``\\d``, ``\\w``, ``\\s`` become their ASCII members, ``\\s``
a space). Lookarounds, backreferences, word boundaries, anchors other than a leading ``^`` and a
trailing ``$``, and flags are refused (``PatternRefused``)."""

from __future__ import annotations

import importlib
import json
from typing import Any

STRING_INNER = r'(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])'
_DATE = (
    r"[1-9][0-9]{3}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_HOUR_MIN = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]"
_TIME = rf"{_HOUR_MIN}:[0-5][0-9](?:\.[0-9]{{1,6}})?(?:Z|[+-]{_HOUR_MIN})"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?"
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "ipv4": rf"{_OCTET}(?:\.{_OCTET}){{3}}",
    "email": rf"[a-zA-Z0-9][a-zA-Z0-9._+-]{{0,30}}@{_LABEL}(?:\.{_LABEL}){{1,3}}",
    "uri": rf"https?://{_LABEL}(?:\.{_LABEL}){{0,3}}(?:/[A-Za-z0-9._~-]{{0,20}}){{0,4}}",
}
# the fewest and most characters of each format's strings (minLength / maxLength outside them are refused)
FORMAT_LENGTHS = {
    "date": (10, 10),
    "time": (9, 21),
    "date-time": (20, 32),
    "uuid": (36, 36),
    "ipv4": (7, 15),
    "email": (5, 123),
    "uri": (8, 183),
}

# code points a JSON string may hold unescaped (as STRING_INNER allows): not controls, '"', '\', DEL-0x9F, surrogates
_UNSAFE = [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x9F), (0xD800, 0xDFFF)]
_ASCII = [(0, 0x7F)]
_CATEGORIES = {  # each category's ASCII members, exactly as Python's str patterns read them
    "CATEGORY_DIGIT": [(0x30, 0x39)],
    "CATEGORY_WORD": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "CATEGORY_SPACE": [(0x09, 0x0D), (0x1C, 0x20)],
}
_FLAG_UNICODE = 32
_META = set("\\.^$*+?{}[]|()-")  # not "&" / "~": xgrammar reads their escapes as warnings

Intervals = list[tuple[int, int]]


class PatternRefused(ValueError):
    """The pattern uses a construct forge cannot write as a JSON-text regex."""


def string_regex(min_len: int, max_len: int | None) -> str:
    upper = "" if max_len is None else str(max_len)
    if min_len == 0 and max_len is None:
        return f'"{STRING_INNER}*"'
    return f'"{STRING_INNER}{{{min_len},{upper}}}"'


def _merged(a: Intervals) -> Intervals:
    """Sorted, overlapping and touching intervals joined (so a class never repeats a character)."""
    out: Intervals = []
    for lo, hi in sorted(a):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _subtract(a: Intervals, b: Intervals) -> Intervals:
    out = []
    for lo, hi in _merged(a):
        for blo, bhi in sorted(b):
            if bhi < lo or blo > hi:
                continue
            if blo > lo:
                out.append((lo, blo - 1))
            lo = max(lo, bhi + 1)
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return out


def _char(cp: int) -> str:
    ch = chr(cp)
    return "\\" + ch if ch in _META else ch


def _class(intervals: Intervals) -> str:
    safe = _subtract(intervals, _UNSAFE)
    if not safe:
        raise PatternRefused("a character class of the pattern holds only characters JSON must escape")
    body = "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in safe)
    return f"[{body}]"


def _literal(cp: int) -> str:
    if any(lo <= cp <= hi for lo, hi in _UNSAFE):
        if 0xD800 <= cp <= 0xDFFF:
            raise PatternRefused("the pattern holds a surrogate code point")
        return "".join(_char(ord(c)) for c in json.dumps(chr(cp))[1:-1])
    return _char(cp)


def _set_items(items: list[tuple[Any, Any]]) -> Intervals:
    """A class's members as intervals (within ASCII when a negated class names a category)."""
    negate, out, categories = False, [], False
    for op, arg in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            out.append((arg, arg))
        elif name == "RANGE":
            out.append(arg)
        elif name == "CATEGORY" and str(arg) in _CATEGORIES:
            out.extend(_CATEGORIES[str(arg)])
            categories = True
        else:
            raise PatternRefused(f"the pattern's character class uses {name} {arg}, which forge cannot write")
    if negate:
        return _subtract(_ASCII if categories else [(0, 0x10FFFF)], out)
    return out


def _repeat(lo: int, hi: int, body: str, maxrepeat: int) -> str:
    if hi == maxrepeat:
        return f"(?:{body}){{{lo},}}"
    return f"(?:{body}){{{lo},{hi}}}"


class _Writer:
    def __init__(self) -> None:
        self.parser: Any = importlib.import_module("re._parser")
        self.maxrepeat = importlib.import_module("re._constants").MAXREPEAT

    def seq(self, nodes: Any) -> str:
        return "".join(self.node(op, arg) for op, arg in nodes)

    def node(self, op: Any, arg: Any) -> str:
        name = str(op)
        if name == "LITERAL":
            return _literal(arg)
        if name == "NOT_LITERAL":
            return _class(_subtract([(0, 0x10FFFF)], [(arg, arg)]))
        if name == "ANY":
            return _class([(0, 0x09), (0x0B, 0x10FFFF)])
        if name == "IN":
            return _class(_set_items(arg))
        if name == "BRANCH":
            return "(?:" + "|".join(self.seq(s) for s in arg[1]) + ")"
        if name == "SUBPATTERN":
            if arg[1] or arg[2]:
                raise PatternRefused("the pattern sets regex flags, which forge does not support")
            return "(?:" + self.seq(arg[3]) + ")"
        if name in ("MAX_REPEAT", "MIN_REPEAT"):
            return _repeat(arg[0], arg[1], self.seq(arg[2]), self.maxrepeat)
        raise PatternRefused(f"the pattern uses {name}, which forge cannot enforce")

    def pattern(self, pattern: str) -> str:
        try:
            parsed = self.parser.parse(pattern)
        except Exception as exc:  # re.error, or an overflow of its repeat counts
            raise PatternRefused(f"the pattern is not a valid regex: {exc}") from exc
        if parsed.state.flags & ~_FLAG_UNICODE:
            raise PatternRefused("the pattern sets regex flags, which forge does not support")
        nodes = list(parsed)
        if nodes and (str(nodes[0][0]), str(nodes[0][1])) == ("AT", "AT_BEGINNING"):
            nodes = nodes[1:]
        if nodes and (str(nodes[-1][0]), str(nodes[-1][1])) == ("AT", "AT_END"):
            nodes = nodes[:-1]
        return self.seq(nodes)


def pattern_regex(pattern: str) -> str:
    """The JSON string texts whose value matches ``pattern`` whole (see the module doc)."""
    return f'"{_Writer().pattern(pattern)}"'


def escape_literal(text: str) -> str:
    """A regex matching exactly ``text``."""
    return "".join(_char(ord(c)) for c in text)
