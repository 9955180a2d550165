"""Chat messages and tool definitions: the parts of a chat completions (and ``/tokenize``) body's
``messages``, ``tools`` and ``tool_choice``. Part of ``forge.server.protocol``, which re-exports its names."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from forge.server.protocol_common import APIError, Strict


class ContentPart(Strict):
    type: str
    text: str | None = None


class ToolCallFunction(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class FunctionDef(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.type != "text" or p.text is None:
                raise APIError(f"content part type {p.type!r} is not supported (text only)", param="messages")
            parts.append(p.text)
        return "".join(parts)
