"""Parallel sampling (``SamplingParams.n > 1``): one request fans out into n sequences over one prompt.

The engine adds the request with its n - 1 siblings as ``forks``; the scheduler computes the
prompt once (for the parent) and then forks each child onto the parent's KV blocks, shared by
reference count and copied on first write (``KVCacheManager.fork``)."""

from __future__ import annotations

import dataclasses

from forge.core.request import Request


def sibling_ids(request: Request) -> list[str]:
    """The ids of the request's n sequences: its own, then ``<id>#1`` ... ``<id>#{n-1}``."""
    return [request.request_id] + [f"{request.request_id}#{i}" for i in range(1, request.sampling_params.n)]


def output_ids(request: Request) -> list[str]:
    """The ids of the final outputs ``request`` gives its caller, in order: its n sequences, or for a
    beam search (``request.beam_search``) its ``beam_width`` results, best first (ids as
    ``sibling_ids``)."""
    n = request.beam_search.beam_width if request.beam_search is not None else request.sampling_params.n
    if n == 1:  # (most requests)
        return [request.request_id]
    return [request.request_id] + [f"{request.request_id}#{i}" for i in range(1, n)]


def fan_out(request: Request) -> list[Request]:
    """The n - 1 children of ``request``: the same prompt, arrival, priority and expected length;
    ``n = 1`` and, when the parent has a seed, seeds ``seed + i`` so samples differ."""
    params = request.sampling_params
    if params.n == 1:  # (most requests)
        return []
    children = []
    for i, rid in enumerate(sibling_ids(request)[1:], start=1):
        seed = None if params.seed is None else params.seed + i
        children.append(
            Request(
                request_id=rid,
                prompt_token_ids=list(request.prompt_token_ids),
                sampling_params=dataclasses.replace(params, n=1, seed=seed),
                arrival_time=request.arrival_time,
                priority=request.priority,
                expected_output_len=request.expected_output_len,
            )
        )
    return children
