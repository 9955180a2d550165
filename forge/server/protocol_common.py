"""What every request body shares: the OpenAI error shape (``APIError``), the refusal of fields a body
does not declare, strict request parts (``Strict``) and the int64 bounds of integer fields. Part of
``forge.server.protocol``, which re-exports its names."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]


class APIError(Exception):
    """Answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# OpenAI fields that change nothing forge returns (bookkeeping for OpenAI's platform): accepted
# and ignored. Any other field a request model does not declare is refused with a 400 naming it.
HARMLESS_FIELDS = frozenset({"user", "metadata", "store", "service_tier"})


def refuse_unknown_fields(body: BaseModel) -> None:
    """A 400 naming the first field ``body`` does not declare, unless it is one of HARMLESS_FIELDS."""
    unknown = sorted(set(body.model_extra or {}) - HARMLESS_FIELDS)
    if unknown:
        shown = unknown[0][:64]
        raise APIError(f"unsupported field {shown!r}", param=shown, code="unsupported_field")


class Strict(BaseModel):
    """A request part: strict types ("5" is not an int) and unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid")
