"""Every error the server answers, in OpenAI's shape and in forge's words.

``install_error_handlers`` maps forge's ``APIError``, request-validation errors, Starlette's
HTTP errors (unknown route, method not allowed, unparsable body) and any unexpected exception
to ``{"error": {"message", "type", "param", "code"}}``; library text (pydantic's, Starlette's,
torch's) is logged, never sent. ``ERROR_RESPONSES`` documents these answers in the OpenAPI
schema so schema-driven clients and fuzzers know them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import Request

from forge.server.protocol import APIError
from forge.tokenizers.none import TokenizerRequired

log = logging.getLogger("forge.server")
MAX_ECHOED_PATH = 64


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


_DESCRIPTIONS = {
    400: "Invalid request (bad field, body not JSON, text not valid Unicode)",
    401: "Missing or invalid API key",
    403: "Not allowed (POST /shutdown without the admin key)",
    404: "Unknown model or route",
    405: "Method not allowed on this route",
    409: "The batch's state does not allow this (cancelling a finished batch)",
    408: "The request body did not arrive in time (server.body_timeout_s)",
    413: "The request body is larger than server.max_body_bytes",
    429: "Rate limit exceeded (see Retry-After)",
    500: "Internal error",
    503: "Overloaded or shutting down",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text} for status, text in _DESCRIPTIONS.items()
}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def clip(text: str, limit: int = MAX_ECHOED_PATH) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def validation_error(errors: Sequence[Any]) -> APIError:
    """The 400 for pydantic's ``errors()`` of a request body: the first one, in forge's words."""
    if not errors:
        return APIError("invalid request", 400)
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return APIError("the request body is not valid JSON", 400)
    param = clip(".".join(loc)) or None
    return APIError(f"{param or 'body'}: {first.get('msg', 'invalid value')}", 400, param=param)


def _http_error(request: Request, exc: HTTPException) -> APIError:
    """Starlette's own answers (routing, body parsing) in forge's words."""
    where = f"{request.method} {clip(request.url.path)}"
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        return APIError(f"no route {where}", 404, "invalid_request_error", code="not_found")
    if exc.status_code == 405:
        message = f"method not allowed: {where}"
        return APIError(message, 405, "invalid_request_error", code="method_not_allowed", headers=headers)
    if exc.status_code == 400:
        return APIError("the request body could not be parsed", 400)
    if exc.status_code >= 500:
        return APIError("internal server error", exc.status_code, "internal_error")
    return APIError(f"request failed ({exc.status_code})", exc.status_code, headers=headers)


def document_errors(app: FastAPI) -> None:
    """The app's OpenAPI schema without FastAPI's 422 entries: validation errors are answered
    400 in OpenAI's shape (``ERROR_RESPONSES``), never 422."""
    build_schema = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build_schema()
            for operation in (op for path in schema.get("paths", {}).values() for op in path.values()):
                operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_error_handlers(app: FastAPI) -> None:
    document_errors(app)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc.errors()))

    @app.exception_handler(TokenizerRequired)  # text asked of a model.tokenizer=none model (embeddings...)
    async def _no_tokenizer(_: Request, exc: TokenizerRequired) -> JSONResponse:
        return error_response(APIError(str(exc)))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(_http_error(request, exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, clip(request.url.path), exc_info=exc)
        return error_response(APIError("internal server error", 500, "internal_error"))
