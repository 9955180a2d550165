"""JSON request bodies parsed and validated on a worker thread (``OffLoopBodyRoute``).

FastAPI parses a route's JSON body and validates it against the route's model on the event
loop, before the route runs: for a body of 100,000 chat messages (3 MB, under
``server.max_body_bytes``) that is about a second in which no other request, ``/health``
included, is answered. A route of class ``OffLoopBodyRoute`` reads the body, and parses and
validates it on a worker thread; FastAPI then gets the validated model, which its own validation
passes through unchanged (pydantic does not revalidate an instance of the model). pydantic holds
the GIL for a whole ``model_validate`` call, so a long list of models (``messages``, ``tools``) is
validated an item at a time first: the event loop's thread gets the GIL between items. Errors are
FastAPI's (``RequestValidationError``, the same ``loc``s), so they are answered as before; a body
that is not JSON-typed, or not even UTF-8, goes to FastAPI as it is, for its own answer."""

from __future__ import annotations

import asyncio
import email.message
import json
from collections.abc import Callable, Coroutine
from types import UnionType
from typing import Any, Union, get_args, get_origin

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
INLINE_BYTES = 1 << 16  # bodies up to this size are parsed on the event loop (a few ms at most)
ITEM_BY_ITEM = 256  # lists of models longer than this are validated an item at a time


class _Parsed(Request):
    """The request with its body read, parsed and validated already."""

    def __init__(self, request: Request, raw: bytes, value: BaseModel) -> None:
        super().__init__(request.scope, request.receive)
        self.raw_body = raw
        self.parsed = value

    async def body(self) -> bytes:
        return self.raw_body

    async def json(self) -> Any:
        return self.parsed


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule: ``application/json`` or ``application/*+json``."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _model_lists(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The fields of ``model`` holding a list of models (``list[M]`` or ``list[M] | None``), by alias."""
    out: dict[str, type[BaseModel]] = {}
    for name, info in model.model_fields.items():
        options = get_args(info.annotation) if get_origin(info.annotation) in (Union, UnionType) else ()
        for option in options or (info.annotation,):
            args = get_args(option)
            if get_origin(option) is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
                out[info.alias or name] = args[0]
    return out


def _validate_items(model: type[BaseModel], data: Any) -> Any:
    """``data`` with each long list of models validated an item at a time (the items as models; an
    invalid item's error is the request's)."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key, item_model in _model_lists(model).items():
        items = data.get(key)
        if isinstance(items, list) and len(items) > ITEM_BY_ITEM:
            out[key] = [_item(item_model, item, (key, i)) for i, item in enumerate(items)]
    return out


def _item(model: type[BaseModel], item: Any, where: tuple[str, int]) -> BaseModel:
    try:
        return model.model_validate(item)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *where, *e["loc"])} for e in exc.errors()]) from None


def _parse(model: type[BaseModel], raw: bytes) -> BaseModel:
    """``raw`` as ``model``; FastAPI's ``RequestValidationError`` if it is not JSON or not valid."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([error]) from None
    try:
        return model.model_validate(_validate_items(model, data))
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


class OffLoopBodyRoute(APIRoute):
    """An ``APIRoute`` whose JSON body (a pydantic model) is parsed and validated off the event loop."""

    def get_route_handler(self) -> Handler:
        handle = super().get_route_handler()
        model = self.body_field.field_info.annotation if self.body_field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return handle
        body_model: type[BaseModel] = model

        async def handler(request: Request) -> Response:
            if not _is_json(request.headers.get("content-type")):
                return await handle(request)
            raw = await request.body()
            try:
                if len(raw) <= INLINE_BYTES:  # a thread's hand-off would cost more than the parse
                    value = _parse(body_model, raw) if raw else None
                else:
                    value = await asyncio.to_thread(_parse, body_model, raw)
            except RequestValidationError:
                raise
            except ValueError:  # not UTF-8 or UTF-16/32: FastAPI's own answer
                value = None
            return await handle(request if value is None else _Parsed(request, raw, value))

        return handler
