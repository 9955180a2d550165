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


def echo_logprobs(
    tokenizer: Tokenizer, prompt_ids: list[int], prompt_logprobs: list[dict[int, float] | None] | None, k: int
) -> dict[str, Any]:
    """Completions' logprobs of an echoed prompt (OpenAI's legacy shape): each prompt token, its
    logprob and top ``k`` given the tokens before it, null for the first token (none when the engine
    returned no prompt logprobs), offsets from 0."""
    entries = prompt_logprobs or [None] * len(prompt_ids)
    tokens, lps, offsets = [], [], []
    tops: list[dict[str, float] | None] = []
    pos = 0
    for tok, e in zip(prompt_ids, entries, strict=False):
        s = token_str(tokenizer, tok)
        tokens.append(s)
        lps.append(None if e is None else e.get(tok))
        if e is None:
            tops.append(None)
        else:
            top = {token_str(tokenizer, t): lp for t, lp in _top(e, k)}
            if tok in e:
                top[s] = e[tok]
            tops.append(top)
        offsets.append(pos)
        pos += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def joined_logprobs(first: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """Two completions' logprobs objects, one after the other."""
    return {key: first[key] + then[key] for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def vllm_prompt_logprobs(
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    prompt_logprobs: list[dict[int, float] | None] | None,
    k: int,
    ranks: list[int | None] | None = None,
) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's ``prompt_logprobs``: per prompt token None (the first) or {token id: {logprob, rank,
    decoded_token}} for it and the top ``k`` (the engine's entries may hold more). ``rank`` is the
    place among the top ``k`` (1: most likely); the prompt token's is its rank in the whole vocabulary
    (``ranks``, the engine's: how many tokens are at least as likely), as vLLM gives it."""
    if prompt_logprobs is None:
        return None
    out: list[dict[str, dict[str, Any]] | None] = []
    for p, (tok, entries) in enumerate(zip(prompt_ids, prompt_logprobs, strict=False)):
        if entries is None:
            out.append(None)
            continue
        ranked: list[tuple[int, float, int | None]] = [(t, lp, i + 1) for i, (t, lp) in enumerate(_top(entries, k))]
        own = ranks[p] if ranks is not None and p < len(ranks) else None
        ranked = [(t, lp, own if t == tok and own is not None else r) for t, lp, r in ranked]
        if tok in entries and all(t != tok for t, _, _ in ranked):
            ranked.insert(0, (tok, entries[tok], own))
        out.append(
            {str(t): {"logprob": lp, "rank": rank, "decoded_token": token_str(tokenizer, t)} for t, lp, rank in ranked}
        )
    return out


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


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens``: the prompt tokens whose KV came
    from the prefix cache (0 with prefix caching off), as OpenAI reports it on every response."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
