"""Values checked against a setting's declared type (a dataclass field's or a target's parameter's hint).

Strict where YAML and OmegaConf are lenient: an ``int`` setting takes an integer (not ``true``, not
``'8001'``, not ``8001.0``), a ``float`` one an integer or a number, a ``bool`` one ``true``/``false``
(not ``3``), a ``str`` one text, a ``list[str]`` one a list of text (never a bare string, which Python
would take as a list of characters), ``X | None`` also ``null``. Other hints are not checked here."""

from __future__ import annotations

import types
import typing
from typing import Any

_NAMES: dict[Any, str] = {int: "an integer", float: "a number", bool: "true or false", str: "text"}
_PLURALS: dict[Any, str] = {int: "integers", float: "numbers", bool: "booleans", str: "text"}
_SHOWN_CHARS = 60


def _without_none(hint: Any) -> tuple[Any, bool]:
    """``hint`` without ``None``, and whether ``None`` was allowed."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def _fits(hint: Any, value: Any) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    (item,) = typing.get_args(hint)
    return isinstance(value, list | tuple) and all(_fits(item, v) for v in value)


def _checked(hint: Any) -> bool:
    if hint in _NAMES:
        return True
    return typing.get_origin(hint) is list and typing.get_args(hint)[:1] in [(t,) for t in _PLURALS]


def expected(hint: Any) -> str:
    """What a value of ``hint`` is, in words (``an integer``, ``a list of text or null``)."""
    base, optional = _without_none(hint)
    words = _NAMES[base] if base in _NAMES else f"a list of {_PLURALS[typing.get_args(base)[0]]}"
    return f"{words} or null" if optional else words


def type_problem(hint: Any, value: Any) -> str | None:
    """None when ``value`` is a ``hint`` (or ``hint`` is not one checked here), else what was expected."""
    base, optional = _without_none(hint)
    if not _checked(base) or (optional and value is None) or _fits(base, value):
        return None
    return f"expected {expected(hint)}"


def shown(value: Any, secret: bool = False) -> str:
    """``value`` for a one-line message: its repr cut to a few dozen characters, or only its type when
    ``secret``."""
    if secret:
        return f"<a {type(value).__name__}, redacted>"
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def is_text(hint: Any) -> bool:
    """Whether ``hint`` is ``str`` or ``str | None``."""
    return _without_none(hint)[0] is str


def is_optional(hint: Any) -> bool:
    return _without_none(hint)[1]


def is_list(hint: Any) -> bool:
    return typing.get_origin(_without_none(hint)[0]) is list
