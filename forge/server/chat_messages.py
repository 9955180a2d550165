"""Chat messages as Hugging Face chat templates take them."""

from __future__ import annotations

import json
from typing import Any

from forge.server.protocol import APIError, ChatMessage


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as Hugging Face templates take them: assistant ``tool_calls`` with their
    arguments as objects, tool results with the ``tool_call_id`` of an earlier call (400 if none
    matches), each field only where OpenAI allows it."""
    out: list[dict[str, Any]] = []
    call_ids: set[str] = set()
    for i, m in enumerate(messages):
        item: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name is not None:
            item["name"] = m.name
        if m.tool_calls:
            if m.role != "assistant":
                raise APIError("only assistant messages carry tool_calls", param=f"messages.{i}.tool_calls")
            calls = []
            for j, call in enumerate(m.tool_calls):
                try:
                    args = json.loads(call.function.arguments)
                except ValueError as exc:
                    raise APIError(
                        f"tool call arguments are not JSON: {exc}", param=f"messages.{i}.tool_calls.{j}"
                    ) from exc
                calls.append(
                    {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": args}}
                )
                call_ids.add(call.id)
            item["tool_calls"] = calls
        if m.role == "tool":
            if m.tool_call_id is None or m.tool_call_id not in call_ids:
                raise APIError(
                    "a tool message needs the tool_call_id of an earlier assistant tool call",
                    param=f"messages.{i}.tool_call_id",
                )
            item["tool_call_id"] = m.tool_call_id
        elif m.tool_call_id is not None:
            raise APIError("only tool messages carry tool_call_id", param=f"messages.{i}.tool_call_id")
        out.append(item)
    return out


# Template variables the request sets through its own fields (or the tokenizer does): a
# chat_template_kwargs entry may not set them.
RESERVED_TEMPLATE_VARIABLES = {
    "messages": "messages",
    "tools": "tools",
    "add_generation_prompt": "add_generation_prompt",
    "bos_token": None,
    "eos_token": None,
    "pad_token": None,
}


def template_kwargs(kwargs: dict[str, Any] | None, variables: frozenset[str]) -> dict[str, Any]:
    """vLLM's ``chat_template_kwargs``, checked against the ``variables`` the template reads: a key the
    template never reads would change nothing, so it is a 400 naming it (as one the request or the
    tokenizer already sets)."""
    if not kwargs:
        return {}
    for key in sorted(kwargs):
        if key in RESERVED_TEMPLATE_VARIABLES:
            field = RESERVED_TEMPLATE_VARIABLES[key]
            how = f"set it with the request's {field!r} field" if field else "the tokenizer sets it"
            raise APIError(f"chat_template_kwargs may not set {key!r} ({how})", param="chat_template_kwargs")
    unused = sorted(set(kwargs) - variables)
    if unused:
        shown = ", ".join(repr(k[:64]) for k in unused[:8])
        raise APIError(
            f"chat_template_kwargs: the chat template does not use {shown}",
            param="chat_template_kwargs",
            code="unsupported_field",
        )
    return dict(kwargs)
