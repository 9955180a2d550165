"""Checks every request body gets before anything else reads it: the served model's name, text that
is valid Unicode, and a number field's range."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from forge.server.protocol import APIError

MAX_ECHOED_NAME = 64


def check_model(model: str | None, served: str) -> None:
    """404 unless ``model`` is the served one (``None``: the served one). The name is echoed
    back cut to ``MAX_ECHOED_NAME`` characters."""
    if model is not None and model != served:
        shown = model if len(model) <= MAX_ECHOED_NAME else model[:MAX_ECHOED_NAME] + "..."
        shown = shown.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate is echoed escaped
        raise APIError(f"The model `{shown}` does not exist.", 404, "NotFoundError", "model", "model_not_found")


def _items(value: Any) -> Any:
    """The (key, item) pairs inside ``value`` to look through; None for a leaf (or token ids)."""
    if isinstance(value, BaseModel):
        fields = [(info.alias or name, getattr(value, name)) for name, info in type(value).model_fields.items()]
        return [*fields, *(value.model_extra or {}).items()]
    if isinstance(value, dict):
        return value.items()
    if isinstance(value, list | tuple) and not all(type(x) is int for x in value):  # token ids: no per-item call
        return enumerate(value)
    return None


def _unencodable(value: Any, path: str) -> str | None:
    """The path of the first string in ``value`` that is not valid Unicode (a lone surrogate
    from a ``\\ud800`` escape cannot be encoded to UTF-8, so no tokenizer can take it)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    items = _items(value)
    if items is None:
        return None
    for key, item in items:
        key_path = _unencodable(key, path or "body") if isinstance(key, str) else None
        found = key_path or _unencodable(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def check_encodable(body: BaseModel) -> None:
    """400 if any text in the body (prompt, messages, stop, schema, ...) is not valid Unicode."""
    path = _unencodable(body, "")
    if path is not None:
        raise APIError(f"{path} contains text that is not valid Unicode (a lone surrogate)", param=path)


def check_range(name: str, value: float | None, low: float, high: float, low_open: bool = False) -> None:
    """400 naming ``name`` when ``value`` (if given) is outside ``[low, high]`` (``(low, high]``)."""
    if value is None:
        return
    if value < low or value > high or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise APIError(f"{name}={value} is out of range {bound}", param=name)


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    """400 naming ``param`` when an id is outside the vocabulary."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise APIError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})", param=param)
