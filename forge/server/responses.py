"""OpenAI response and stream-chunk bodies."""

from __future__ import annotations

import json
from typing import Any

from forge.tokenizers.base import Tokenizer


def token_str(tokenizer: Tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def _top(entries: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(entries.items(), key=lambda kv: -kv[1])[:k]


def completion_logprobs(
    tokenizer: Tokenizer, token_ids: list[int], logprobs: list[dict[int, float]], k: int, offset: int
) -> dict[str, Any]:
    """Completions' logprobs: each token's top ``k`` plus the sampled token (up to k + 1 entries)."""
    tokens, lps, tops, offsets = [], [], [], []
    pos = offset
    for tok, entries in zip(token_ids, logprobs, strict=False):
        s = token_str(tokenizer, tok)
        tokens.append(s)
        lps.append(entries.get(tok))
        top = {token_str(tokenizer, t): lp for t, lp in _top(entries, k)}
        if tok in entries:  # the sampled token is always among them (OpenAI's and vLLM's k + 1)
            top[s] = entries[tok]
        tops.append(top)
        offsets.append(pos)
        pos += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(
    tokenizer: Tokenizer, token_ids: list[int], logprobs: list[dict[int, float]], k: int
) -> dict[str, Any]:
    content = []
    for tok, entries in zip(token_ids, logprobs, strict=False):
        s = token_str(tokenizer, tok)
        content.append(
            {
                "token": s,
                "logprob": entries.get(tok),
                "bytes": list(s.encode("utf-8")),
                "top_logprobs": [
                    {"token": (ts := token_str(tokenizer, t)), "logprob": lp, "bytes": list(ts.encode("utf-8"))}
                    for t, lp in _top(entries, k)
                ],
            }
        )
    return {"content": content}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
