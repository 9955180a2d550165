"""The lines of a batch input file and of its output and error files (OpenAI's Batch API and
vLLM's ``run-batch`` share the format), and the run of one line through an endpoint's handler.

Input line: ``{"custom_id": str, "method": "POST", "url": "/v1/completions", "body": {...}}``.
Output line: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``
with ``error`` null when a response exists (a 4xx/5xx response is a response); a line that could
not be read has ``"response": null`` and ``"error": {"code", "message", "line"}`` (1-based)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from forge.server.errors import validation_error
from forge.server.json_nesting import MAX_JSON_NESTING, NestingError, check_nesting
from forge.server.protocol import APIError

log = logging.getLogger("forge.server")
MAX_CUSTOM_ID = 512

# a request body in, (HTTP status, response body) out; what the endpoint would have answered
Handler = Callable[[dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch; ``line`` is its 1-based line number in the input file."""

    line: int
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineError:
    """A line that is not a request forge can run."""

    line: int
    custom_id: str | None
    code: str
    message: str


def _parse(number: int, raw: str) -> Any:
    """The line's JSON; ``ValueError`` (``NestingError`` among them) when it is not JSON forge reads."""
    if raw.count("{") + raw.count("[") > MAX_JSON_NESTING:  # else it cannot nest deeper: skip the scan
        check_nesting(raw, MAX_JSON_NESTING, f"line {number}")
    return json.loads(raw)


def _read_line(number: int, raw: str, endpoint: str | None, known: Collection[str]) -> BatchLine | LineError:
    try:
        obj = _parse(number, raw)
    except NestingError as exc:
        return LineError(number, None, "invalid_json", str(exc))
    except ValueError:
        return LineError(number, None, "invalid_json", f"line {number}: not valid JSON")
    if not isinstance(obj, dict):
        return LineError(number, None, "invalid_request", f"line {number}: not a JSON object")
    custom_id = obj.get("custom_id")
    cid = custom_id if isinstance(custom_id, str) and 0 < len(custom_id) <= MAX_CUSTOM_ID else None

    def bad(message: str) -> LineError:
        return LineError(number, cid, "invalid_request", f"line {number}: {message}")

    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        return bad(f"unknown field {unknown[0][:64]!r} (a line has custom_id, method, url, body)")
    if cid is None:
        return bad(f"custom_id must be a non-empty string of at most {MAX_CUSTOM_ID} characters")
    if obj.get("method") != "POST":
        return bad('method must be "POST"')
    url = obj.get("url")
    if not isinstance(url, str) or url not in known:
        return bad(f"url must be one of {sorted(known)}")
    if endpoint is not None and url != endpoint:
        return bad(f"url {url} differs from the batch's endpoint {endpoint}")
    body = obj.get("body")
    if not isinstance(body, dict):
        return bad("body must be a JSON object")
    return BatchLine(number, cid, url, body)


def read_lines(text: str, endpoint: str | None, known: Collection[str]) -> list[BatchLine | LineError]:
    """Every non-blank line of ``text`` as a request or an error, in order; a repeated
    ``custom_id`` is an error on each later line (OpenAI requires them unique). Lines end at
    ``\n`` only, as OpenAI and vLLM read them (a raw U+2028 or U+0085 in a string is text); a
    line nested deeper than ``MAX_JSON_NESTING`` is an error on that line."""
    seen: set[str] = set()
    out: list[BatchLine | LineError] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        item = _read_line(number, raw, endpoint, known)
        if isinstance(item, BatchLine):
            if item.custom_id in seen:
                item = LineError(number, item.custom_id, "duplicate_custom_id", f"line {number}: custom_id repeated")
            else:
                seen.add(item.custom_id)
        out.append(item)
    return out


def error_record(err: LineError) -> dict[str, Any]:
    error = {"code": err.code, "message": err.message, "line": err.line}
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": err.custom_id, "response": None, "error": error}


def response_record(line: BatchLine, status: int, body: dict[str, Any]) -> dict[str, Any]:
    response = {"status_code": status, "request_id": f"req_{uuid.uuid4().hex[:24]}", "body": body}
    rid = f"batch_req_{uuid.uuid4().hex[:24]}"
    return {"id": rid, "custom_id": line.custom_id, "response": response, "error": None}


def is_record(record: Any) -> bool:
    """``record`` is an output line as ``error_record`` or ``response_record`` makes them."""
    if not (isinstance(record, dict) and isinstance(record.get("id"), str)):
        return False
    if not isinstance(record.get("custom_id"), str | None):
        return False
    response, error = record.get("response"), record.get("error")
    if response is None:
        return isinstance(error, dict)
    status = response.get("status_code") if isinstance(response, dict) else None
    return error is None and type(status) is int and 100 <= status <= 599 and isinstance(response.get("body"), dict)


def is_success(record: dict[str, Any]) -> bool:
    """A valid record (``is_record``) whose request got a 2xx response."""
    response = record.get("response")
    return response is not None and 200 <= int(response["status_code"]) < 300


def json_handler(model: type[BaseModel], call: Callable[[Any], Awaitable[Response]]) -> Handler:
    """A handler that validates the body as ``model`` and answers what ``call`` (the route's
    function) answers, errors in OpenAI's shape as the HTTP route would send them. Streaming is
    refused (a batch line's response is one JSON body)."""

    async def handle(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            if body.get("stream"):
                raise APIError("stream is not supported in batch requests", param="stream")
            try:
                request = model.model_validate(body)
            except ValidationError as exc:
                raise validation_error(exc.errors()) from None
            response = await call(request)
        except APIError as err:
            return err.status, err.body()
        except Exception:
            log.exception("batch request failed")
            return 500, APIError("internal server error", 500, "internal_error").body()
        return response.status_code, json.loads(bytes(response.body))

    return handle


async def run_line(handlers: dict[str, Handler], line: BatchLine, priority: int | None = None) -> dict[str, Any]:
    """The output record of one line; ``priority``: the least priority value its request carries."""
    body = line.body
    if priority is not None:
        given = body.get("priority", 0)
        body = {**body, "priority": max(given, priority) if isinstance(given, int) else given}
    status, answer = await handlers[line.url](body)
    return response_record(line, status, answer)
