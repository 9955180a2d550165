"""The nesting limit on JSON the server parses (``server.max_json_nesting``).

A request body is measured before anything parses it (``body_nesting_error``, called by
``BodyLimits`` for every body but a multipart upload); JSON text a body carries inside a string
(``guided_json`` or ``structured_outputs.json`` given as text, a tool call's ``arguments``) is
measured before it is parsed (``check_embedded_json``), since the body's own depth does not count
it. Past the limit: a 400 naming the setting. Within it, no walk of the parsed value (schema
checks, grammar builds, template renders) comes near Python's recursion limit: the setting may
not exceed ``MAX_JSON_NESTING_CEILING``, the depth at which every such walk was checked
(tests/test_server_bounded.py)."""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel

from forge.server.json_nesting import NestingError, check_nesting
from forge.server.protocol import APIError, ChatMessage, SamplingFields

NESTING_CODE = "nesting_too_deep"


def nesting_error(exc: NestingError, param: str | None = None) -> APIError:
    return APIError(f"{exc} (server.max_json_nesting)", param=param, code=NESTING_CODE)


def body_nesting_error(body: bytes, limit: int) -> APIError | None:
    """The 400 for a body nested deeper than ``limit`` (None if it is not)."""
    try:
        check_nesting(body, limit, "the request body")
    except NestingError as exc:
        return nesting_error(exc)
    return None


def _json_texts(body: BaseModel) -> Iterator[tuple[str, str]]:
    """(param, text) of each JSON text ``body`` carries in a string."""
    if isinstance(body, SamplingFields):
        if isinstance(body.guided_json, str):
            yield "guided_json", body.guided_json
        so = body.structured_outputs
        if so is not None and isinstance(so.json_, str):
            yield "structured_outputs", so.json_
    messages: list[ChatMessage] = getattr(body, "messages", None) or []
    for i, message in enumerate(messages):
        for j, call in enumerate(message.tool_calls or []):
            yield f"messages.{i}.tool_calls.{j}", call.function.arguments


def check_embedded_json(body: BaseModel, limit: int) -> None:
    """400 if a JSON text carried in one of ``body``'s strings nests deeper than ``limit``."""
    for param, text in _json_texts(body):
        try:
            check_nesting(text, limit, param)
        except NestingError as exc:
            raise nesting_error(exc, param) from None
