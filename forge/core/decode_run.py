"""A run of plain decode steps taken at once (``forge.sched.scheduler.Scheduler.plan_decode_run``):
plain data the scheduler, the KV cache, the runner, the clock and the metrics each read."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise

from forge.core.request import Request


@dataclass
class DecodeRun:
    """``steps`` consecutive engine steps of plain decodes (``Request.is_decoding``) and nothing else.

    Row i is ``requests[i]``: at step j (from 0) it computes the token at position ``starts[i] + j``
    and samples the next one, for ``num_steps[i]`` steps (at least 1, at most ``steps``); its first
    computed token is ``token_ids[i]`` (its last output token), each later one the token it sampled
    the step before. ``block_tables[i]`` is its block table (the KV cache's list: it grows as the run's
    slots are reserved). ``finishing[i]``: the request ends (its length limit) after its last step;
    a row that is not finishing runs every step. Step j holds the rows with ``num_steps > j``, in row
    order: equal, step by step, to what ``schedule`` would give."""

    requests: list[Request]
    starts: list[int]
    token_ids: list[int]
    block_tables: list[list[int]]
    num_steps: list[int]
    finishing: list[bool]
    _finish_order: list[int] | None = field(default=None, init=False, repr=False, compare=False)
    _steps: int = field(default=0, init=False, repr=False, compare=False)

    @property
    def steps(self) -> int:
        """The most steps of a row (computed once, as ``finish_order``)."""
        steps = self._steps
        if not steps:
            steps = self._steps = max(self.num_steps)
        return steps

    def truncated(self, steps: int) -> DecodeRun:
        """The run's first ``steps`` steps (a row cut short no longer finishes in it)."""
        num_steps = self.num_steps
        if steps >= max(num_steps):
            return self
        rows = len(num_steps)
        if min(num_steps) > steps:  # every row is cut: none finishes (the common case)
            cut, finishing = [steps] * rows, [False] * rows
        else:
            cut = [n if n < steps else steps for n in num_steps]
            finishing = [f and n <= steps for f, n in zip(self.finishing, num_steps, strict=True)]
        return DecodeRun(self.requests, self.starts, self.token_ids, self.block_tables, cut, finishing)

    def step_shapes(self) -> Iterator[tuple[int, int]]:
        """Per step: its rows (each a decode of one token) and the sum of their contexts after it.
        Lazy: a consumer that stops early pays little for the steps it did not take."""
        num_steps, begin = self.num_steps, self.starts
        rows, starts = len(begin), sum(begin)
        first_end = min(num_steps)
        for step in range(1, first_end + 1):  # every row runs these steps
            yield rows, starts + rows * step
        ends = sorted(set(num_steps))  # the steps some row ends after (read once a consumer goes past the first)
        for ended, end in pairwise(ends):  # the rows that end after step ``ended`` leave
            count = num_steps.count(ended)
            rows -= count
            i = -1
            for _ in range(count):
                i = num_steps.index(ended, i + 1)
                starts -= begin[i]
            for step in range(ended + 1, end + 1):
                yield rows, starts + rows * step

    def running_after(self) -> list[int]:
        """Per step: how many of the rows are still running after it (the finishing rows end after their last)."""
        left, order, num_steps = len(self.num_steps), self.finish_order, self.num_steps
        if not order:  # no row ends within the run (the common case)
            return [left] * self.steps
        ended = [0] * self.steps
        for i in order:
            ended[num_steps[i] - 1] += 1
        out = []
        for e in ended:
            left -= e
            out.append(left)
        return out

    @property
    def finish_order(self) -> list[int]:
        """The finishing rows' indices in the order they end: by last step, then row order (computed once:
        the KV cache, the scheduler and the recorder each read it; not a ``cached_property``, whose lock
        costs more than the sort on Python 3.11)."""
        order = self._finish_order
        if order is None:
            finishing = self.finishing
            order = [i for i in range(len(finishing)) if finishing[i]] if any(finishing) else []
            if len(order) > 1:
                order.sort(key=self.num_steps.__getitem__)
            self._finish_order = order
        return order
