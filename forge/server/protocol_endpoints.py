"""The bodies of the endpoints other than completions and chat: ``/tokenize``, ``/detokenize``,
``/v1/batches``, ``/generate`` and ``/v1/embeddings``. Part of ``forge.server.protocol``, which
re-exports its names."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from forge.server.protocol_common import INT64_MAX, INT64_MIN, Strict, TokenId, refuse_unknown_fields
from forge.server.protocol_messages import ChatMessage, ToolDef


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize`` body (strict types; other fields refused, as ``SamplingFields``')."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolDef] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    def check_known_fields(self) -> None:
        refuse_unknown_fields(self)


class DetokenizeRequest(BaseModel):
    """vLLM's ``/detokenize`` body: token ids are integers ("5", 5.0 and true are not)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    tokens: list[int]

    def check_known_fields(self) -> None:
        refuse_unknown_fields(self)


class CreateBatchRequest(Strict):
    """POST /v1/batches."""

    input_file_id: str = Field(max_length=128)
    endpoint: str = Field(max_length=128)
    completion_window: str = Field(max_length=16)
    metadata: dict[str, str] | None = None


class GenerateRequest(Strict):
    """POST /generate (forge-infer's shape): a prompt and at most ``max_tokens`` greedy tokens."""

    prompt: str
    max_tokens: int = Field(default=32, ge=1, le=INT64_MAX)


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings body: ``input`` a string, strings, token ids or lists of token ids;
    ``encoding_format`` ``float`` or ``base64`` (little-endian float32); ``dimensions`` only as the
    model's own size (its output is not Matryoshka-trained, so truncation is refused)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=INT64_MAX)
    user: str | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)  # vLLM's extension, as in completions

    def check_known_fields(self) -> None:
        """As ``SamplingFields.check_known_fields``."""
        refuse_unknown_fields(self)
