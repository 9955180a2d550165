"""The per-request output budget (``server.max_output_units``): how much one completions or chat request may
make the server hold and send, checked before anything reaches the engine.

A request's output units are, summed over its choices (``n``, ``best_of`` sequences, beam results, each
prompt's): ``max_tokens x (1 + logprob entries per token)`` (``logprobs=k``: k + 1 entries, the top k and
the sampled token), plus for prompt logprobs ``prompt tokens x (1 + entries)`` and for ``echo`` the prompt's
tokens. Each unit is a token or a logprob entry the engine returns, the server keeps until the response is
whole, and the response carries (tens of bytes of JSON, ~100-200 bytes of server memory). An embeddings
request's units are its inputs x the embedding's dimensions (one number each, as costly)."""

from __future__ import annotations

from forge.server.choices import ChoiceSpec
from forge.server.protocol import APIError


def logprob_entries(k: int | None) -> int:
    """Entries per token for ``logprobs=k`` (none when not asked for)."""
    return 0 if k is None else k + 1


def output_units(choices: list[ChoiceSpec], echo: bool = False) -> int:
    """The most output units ``choices`` can produce (each runs to its ``max_tokens``)."""
    total = 0
    for c in choices:
        p = c.params
        total += p.max_tokens * (1 + logprob_entries(p.logprobs))
        if p.prompt_logprobs is not None:
            total += len(c.prompt_ids) * (1 + logprob_entries(p.prompt_logprobs))
        if echo:
            total += len(c.prompt_ids)
    return total


def check_output_budget(choices: list[ChoiceSpec], limit: int, echo: bool = False) -> None:
    """400 naming the limit and its setting when ``choices`` may produce more than ``limit`` units."""
    units = output_units(choices, echo)
    if units > limit:
        raise APIError(
            f"this request may produce {units} output units ({len(choices)} choices, each max_tokens x "
            "(1 + logprob entries per token), plus prompt tokens echoed or with prompt_logprobs); one request "
            f"may produce at most {limit} (server.max_output_units): lower max_tokens, n, best_of, logprobs "
            "or the number of prompts",
            param="max_tokens",
            code="output_budget_exceeded",
        )


def check_embedding_budget(num_inputs: int, dimensions: int, limit: int) -> None:
    """400 naming the limit and its setting when ``num_inputs`` embeddings of ``dimensions`` numbers exceed it."""
    units = num_inputs * dimensions
    if units > limit:
        raise APIError(
            f"this request may produce {units} output units ({num_inputs} inputs x {dimensions} dimensions); one "
            f"request may produce at most {limit} (server.max_output_units): send at most {limit // dimensions} "
            "inputs per request",
            param="input",
            code="output_budget_exceeded",
        )
