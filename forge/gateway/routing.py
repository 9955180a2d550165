"""What a router is given for an HTTP request: a ``Request`` whose prompt "tokens" are the bytes of
the prompt's text (token ids as given), and the gateway's estimate of the tokens it will cost."""

from __future__ import annotations

import json
from typing import Any

from forge.core.request import Request
from forge.core.sampling_params import SamplingParams

BYTES_PER_TOKEN = 4  # the estimate of outstanding tokens: a prompt's bytes / 4 + its max_tokens
DEFAULT_MAX_TOKENS = 256


def prompt_units(path: str, body: dict[str, Any]) -> list[int]:
    """Routing tokens of a request body: a text prompt's UTF-8 bytes, token ids as they are, a chat's
    messages as their JSON text (so a shared system prompt and history are a shared prefix)."""
    if path.endswith("/chat/completions"):
        text = json.dumps(body.get("messages", []), ensure_ascii=False, separators=(",", ":"))
        return list(text.encode()) or [0]
    prompt = body.get("prompt", body.get("input", ""))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [int(t) for t in prompt] or [0]
    if isinstance(prompt, list):
        prompt = "\n".join(p if isinstance(p, str) else json.dumps(p) for p in prompt)
    return list(str(prompt).encode()) or [0]


def routing_request(request_id: str, path: str, body: dict[str, Any]) -> tuple[Request, int]:
    """The ``Request`` a router sees and the tokens the gateway counts as outstanding for it."""
    units = prompt_units(path, body)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or max_tokens < 1:
        max_tokens = DEFAULT_MAX_TOKENS
    request = Request(request_id, units, SamplingParams(max_tokens=max_tokens), expected_output_len=max_tokens)
    return request, len(units) // BYTES_PER_TOKEN + max_tokens
