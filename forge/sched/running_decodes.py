"""The running requests' plain-decode rows (``Scheduler.plan_decode_run``), kept from one decode run to the
next: after a run, only the requests admitted since need checking (the prefill-only steps vLLM V0 takes
between runs touch no running request). Plain data plus the functions that build and advance it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress
from operator import is_, sub

from forge.core.decode_run import DecodeRun
from forge.core.request import Request, RequestStatus


@dataclass(slots=True)  # (not frozen: a frozen dataclass's __init__ costs several times a plain one's; never mutated)
class RunningDecodes:
    """Row i is ``requests[i]``, running and decoding (``Request.is_decoding``), plain greedy with no
    constraint, ending only at its length limit (EOS ignored, no stop tokens), with block table
    ``tables[i]`` (the KV cache's list); it ends once position ``stops[i]`` is computed (``stops[i] -
    num_computed_tokens`` tokens are left)."""

    requests: list[Request]
    tables: list[list[int]]
    stops: list[int]

    @classmethod
    def of(
        cls, requests: list[Request], max_model_len: int, block_table: Callable[[str], list[int]]
    ) -> RunningDecodes | None:
        """The rows of ``requests``, or None if one is not such a decode."""
        status = RequestStatus.RUNNING
        stops: list[int] = []
        for r in requests:
            sp = r.sampling_params
            if r.status is not status or not r.is_decoding or r.constraint is not None or not sp.greedy_to_length:
                return None
            left = min(sp.max_tokens, max_model_len - len(r.prompt_token_ids)) - len(r.output_token_ids)
            stops.append(r.num_computed_tokens + left)
        tables = list(map(block_table, [r.request_id for r in requests]))
        return cls(list(requests), tables, stops)

    def extended(
        self, running: list[Request], max_model_len: int, block_table: Callable[[str], list[int]]
    ) -> RunningDecodes | None:
        """The rows of ``running``: these rows, when they are its first requests (the same objects, in
        order; the caller vouches that only decode runs advanced them since), plus ``of`` the rest;
        else ``of`` all of it."""
        k = len(self.requests)
        if k > len(running) or not all(map(is_, self.requests, running)):
            return RunningDecodes.of(running, max_model_len, block_table)
        if k == len(running):
            return self
        new = RunningDecodes.of(running[k:], max_model_len, block_table)
        if new is None:
            return None
        return RunningDecodes(self.requests + new.requests, self.tables + new.tables, self.stops + new.stops)

    def run(self, max_steps: int) -> DecodeRun:
        """The next steps of every row, at most ``max_steps``, as a ``DecodeRun`` (sharing these lists)."""
        requests = self.requests
        starts = [r.num_computed_tokens for r in requests]  # (a list comprehension: faster than map here)
        tokens = [r.output_token_ids[-1] for r in requests]
        left = list(map(sub, self.stops, starts))
        if max(left, default=0) <= max_steps:  # every row ends within the run
            num_steps, finishing = left, [True] * len(left)
        elif min(left) > max_steps:  # none ends within it
            num_steps, finishing = [max_steps] * len(left), [False] * len(left)
        else:
            num_steps = [n if n < max_steps else max_steps for n in left]
            finishing = [n <= max_steps for n in left]
        return DecodeRun(requests, starts, tokens, self.tables, num_steps, finishing)

    def after(self, run: DecodeRun) -> RunningDecodes:
        """The rows once ``run`` (one of ``run``'s, or a truncation of it) was taken: its finishing rows gone."""
        if not any(run.finishing):
            return self
        keep = [not f for f in run.finishing]
        return RunningDecodes(
            list(compress(self.requests, keep)), list(compress(self.tables, keep)), list(compress(self.stops, keep))
        )
