"""What a router is given for an HTTP request: a ``Request`` whose prompt "tokens" are the bytes of
the prompt's text (token ids as given), and the gateway's estimate of what it will cost a backend."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.gateway.load import Cost

BYTES_PER_TOKEN = 4  # the gateway has no tokenizer: a text prompt's tokens are estimated as its bytes / 4
DEFAULT_MAX_TOKENS = 256


def prompt_units(path: str, body: dict[str, Any]) -> tuple[list[int], int]:
    """Routing tokens of a request body, and how many of them make a model token: token ids as they are
    (1), else a text prompt's UTF-8 bytes or a chat's messages as their JSON text, so that a shared system
    prompt and history are a shared prefix (``BYTES_PER_TOKEN``: the gateway has no tokenizer)."""
    if path.endswith("/chat/completions"):
        text = json.dumps(body.get("messages", []), ensure_ascii=False, separators=(",", ":"))
        return list(text.encode()) or [0], BYTES_PER_TOKEN
    prompt = body.get("prompt", body.get("input", ""))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [int(t) for t in prompt], 1
    if isinstance(prompt, list):
        prompt = "\n".join(p if isinstance(p, str) else json.dumps(p) for p in prompt)
    return list(str(prompt).encode()) or [0], BYTES_PER_TOKEN


@dataclass(frozen=True)
class Routed:
    """A request as the gateway routes it: the ``Request`` a router sees, and what its cost is made of."""

    request: Request
    units_per_token: int  # routing units per model token: 1 for token ids, BYTES_PER_TOKEN for text
    max_tokens: int

    def cost(self, matched_units: int) -> Cost:
        """Its cost on a backend that holds ``matched_units`` of its prompt (by the gateway's record)."""
        new_units = max(0, self.request.num_prompt_tokens - matched_units)
        new_tokens = -(-new_units // self.units_per_token)
        return Cost(tokens=new_tokens + self.max_tokens, kv_tokens=new_tokens)


def routing_request(request_id: str, path: str, body: dict[str, Any]) -> Routed:
    """The ``Request`` a router sees, with what the gateway needs to count it on the backend it picks."""
    units, units_per_token = prompt_units(path, body)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or max_tokens < 1:
        max_tokens = DEFAULT_MAX_TOKENS
    request = Request(request_id, units, SamplingParams(max_tokens=max_tokens), expected_output_len=max_tokens)
    return Routed(request, units_per_token, max_tokens)
