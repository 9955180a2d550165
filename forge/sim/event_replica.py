"""One replica's run computed event by event: the timing-only fast path of ``forge.engine.event_runs``.

The configuration it models is the engine's with FCFS admission, a paged KV cache without prefix caching
(one group), a cost model summed from ``StepSums`` and a model whose tokens no component reads
(``model.timing_only=true``), every request running to its length limit and none preempted. There each
step is every running request's decode, the remainder of a prompt that the budget cut, then admissions in
arrival order; so the replica keeps only aggregates — the running rows, the sum of their computed tokens,
the blocks in use — and two heaps of events: the step at which a row ends, and the step at which a row's
next decode opens a block. A step costs O(1) plus its events, not a pass over the rows, and a request's
token times are a slice of the replica's step end times (a running row decodes at every step).

``EventReplica.run`` raises ``LeftTheModel`` where the run leaves that configuration (a decode that finds
no free block: the engine preempts; a request that fits no empty pool): the engine's own loop takes it.
``tests/test_event_runs.py`` compares its records with the engine's, bit for bit."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from forge.core.request import Request
from forge.sim.step_sums import StepSums, SummedCostModel


class Chunk(NamedTuple):
    """A prompt chunk of a step (a ``StepSums`` ``Span``): its request's index in the run, its first position, its
    tokens, whether it ends the prompt (and samples the first token)."""

    request: int
    start: int
    num_tokens: int
    sample: bool
    num_draft_tokens: int = 0


@dataclass(frozen=True)
class ReplicaLimits:
    """What admissions respect: the step's token budget, ``max_num_seqs``, the KV pool (blocks, block size),
    ``max_model_len``, whether a prompt may be cut into chunks, and the blocks an admission leaves free."""

    budget: int
    max_num_seqs: int
    num_blocks: int
    block_size: int
    max_model_len: int
    chunked_prefill: bool = True
    watermark_blocks: float = 0.0


class LeftTheModel(Exception):
    """The run reached a case the model does not cover (the engine's general paths decide it)."""


@dataclass(frozen=True)
class Finished:
    """A request's record: its index in the run's list, when it was first scheduled, and the steps of its
    first and last tokens (its token times are the ends of the steps between them)."""

    index: int
    scheduled: float
    first_step: int
    last_step: int


class EventReplica:
    """One replica's state while it runs: the aggregates, the event heaps and what it recorded (``ends``:
    each step's end time; ``finished``: in the order they end); each step's ``StepRecord`` fields, as a
    plain tuple, go to ``record_step`` (``StepLog.append``). At most one request is part-way through its
    prompt (``prefilling``): FCFS cuts only the last admission to the budget, and the next step continues it
    before admitting more."""

    def __init__(
        self,
        limits: ReplicaLimits,
        cost: SummedCostModel,
        now: float,
        record_step: Callable[[tuple[int | float, ...]], None],
    ) -> None:
        self.limits, self.cost = limits, cost
        self.now, self.step, self.rows, self.context, self.used, self.order = now, 0, 0, 0, 0, 0
        self.prefilling: tuple[int, int, int] | None = None  # (request index, computed, blocks)
        self.ending: list[tuple[int, int, int]] = []  # (step, admission order, request index)
        self.opening: list[tuple[int, int, int]] = []  # (step, admission order, request index)
        self.live: dict[int, list[int]] = {}  # request index -> [first step, prompt, blocks]
        self.scheduled: dict[int, float] = {}
        self.ends: list[float] = []
        self.record_step = record_step
        self.finished: list[Finished] = []

    def run(self, requests: list[Request], offset: float = 0.0) -> None:
        """Every request (fresh, in FCFS order) to its end; it arrives at ``offset`` + its ``arrival_time``
        on this replica's clock."""
        waiting: list[int] = []
        i = 0
        while i < len(requests) or self.rows or waiting or self.prefilling:
            if not self.rows and not waiting and not self.prefilling and requests[i].arrival_time + offset > self.now:
                self.now = requests[i].arrival_time + offset  # idle until the next arrival
            while i < len(requests) and requests[i].arrival_time + offset <= self.now:
                waiting.append(i)
                i += 1
            self._step(requests, waiting)

    def _step(self, requests: list[Request], waiting: list[int]) -> None:
        start, decodes = self.now, self.rows
        if decodes > self.limits.budget:
            raise LeftTheModel("more rows than the step's budget (some would not decode)")
        partial = self.prefilling[1] if self.prefilling is not None else 0  # computed, but not a decode's
        self._open_blocks()
        chunks = self._continue(requests)
        budget = self.limits.budget - decodes - sum(c.num_tokens for c in chunks)
        chunks += self._admit(requests, waiting, start, budget, decodes + len(chunks))
        tokens = decodes + sum(c.num_tokens for c in chunks)
        if not tokens:
            raise LeftTheModel("a step with nothing to schedule")
        self.now = start + self._time(decodes, self.context - partial + decodes, chunks, tokens)
        self.ends.append(self.now)
        self.context += decodes
        for chunk in chunks:
            self.context += chunk.num_tokens
            if chunk.sample:  # the prompt's last chunk
                self._join(chunk.request, requests[chunk.request])
        self._end_rows()
        self._record(start, decodes, len(chunks), tokens, len(waiting))

    def _record(self, start: float, decodes: int, chunks: int, tokens: int, waiting: int) -> None:
        """The step's ``StepRecord`` fields (``MetricsRecorder.on_step``'s, with ``KVCacheManager.usage``)."""
        bs, total = self.limits.block_size, self.limits.num_blocks
        free, running, context = total - self.used, self.rows + (self.prefilling is not None), self.context
        used_fraction = 1.0 - free * bs / (total * bs)
        self.record_step(
            (self.step, start, self.now, decodes + chunks, tokens, tokens - decodes, decodes, 0, 0, waiting, running,
             0, used_fraction, context, 0, self.used * bs - context, 0, free * bs, total * bs)
        )  # fmt: skip
        self.step += 1

    def _open_blocks(self) -> None:
        """The blocks this step's decodes open, in row (admission) order, before any admission."""
        while self.opening and self.opening[0][0] == self.step:
            _, order, index = heapq.heappop(self.opening)
            row = self.live.get(index)
            if row is None:
                continue  # it ended
            if self.used == self.limits.num_blocks:
                raise LeftTheModel("a decode finds no free block (the engine preempts)")
            self.used += 1
            row[2] += 1
            heapq.heappush(self.opening, (self.step + self.limits.block_size, order, index))

    def _continue(self, requests: list[Request]) -> list[Chunk]:
        """The next chunk of the prompt part-way through (running requests before admissions)."""
        if self.prefilling is None:
            return []
        index, computed, blocks = self.prefilling
        prompt = requests[index].num_prompt_tokens
        n = min(prompt - computed, self.limits.budget - self.rows)
        return [self._take(index, computed, n, blocks, prompt)] if n > 0 else []

    def _admit(
        self, requests: list[Request], waiting: list[int], start: float, budget: int, running: int
    ) -> list[Chunk]:
        """Admissions in arrival order within ``budget``, while fewer than ``max_num_seqs`` run (``running``
        so far) and the pool holds the chunk's blocks (less the watermark)."""
        lim, chunks = self.limits, list[Chunk]()
        while waiting and budget > 0 and running + len(chunks) < lim.max_num_seqs:
            prompt = requests[waiting[0]].num_prompt_tokens
            if prompt > budget and not lim.chunked_prefill:
                break
            n = min(prompt, budget)
            free = lim.num_blocks - self.used - -(-n // lim.block_size)
            if free < 0 or (lim.watermark_blocks and free < lim.watermark_blocks):
                if not self.rows and not chunks and self.prefilling is None:
                    raise LeftTheModel("a request that fits no empty pool")
                break
            self.scheduled[waiting[0]] = start
            chunks.append(self._take(waiting.pop(0), 0, n, 0, prompt))
            budget -= n
        return chunks

    def _take(self, index: int, computed: int, n: int, blocks: int, prompt: int) -> Chunk:
        """The blocks of a chunk of ``n`` prompt tokens from ``computed``; part-way through after it, or not."""
        need = -(-(computed + n) // self.limits.block_size) - blocks
        if self.used + need > self.limits.num_blocks:
            raise LeftTheModel("a prompt's next chunk finds no free block (the engine preempts)")
        self.used += need
        self.prefilling = (index, computed + n, blocks + need) if computed + n < prompt else None
        return Chunk(index, computed, n, computed + n == prompt)

    def _time(self, decodes: int, context: int, chunks: list[Chunk], tokens: int) -> float:
        """The step's time from the sums ``StepSums.of_sched`` takes: ``decodes`` rows whose contexts after
        the step sum to ``context``, then the chunks in row order."""
        if not chunks:
            t = self.cost.decode_step_time(decodes, context)
            return t if t is not None else self.cost.time_of(StepSums.of_rows(decodes, decodes, context, []))
        return self.cost.time_of(StepSums.of_rows(tokens, decodes, context, chunks))

    def _join(self, index: int, request: Request) -> None:
        """A request whose prompt this step completed: its first token now, a decode from the next step."""
        bs, prompt = self.limits.block_size, request.num_prompt_tokens
        blocks = -(-prompt // bs)
        output = min(request.sampling_params.max_tokens, self.limits.max_model_len - prompt)
        self.live[index] = [self.step, prompt, blocks]
        self.rows, self.order = self.rows + 1, self.order + 1
        heapq.heappush(self.ending, (self.step + output - 1, self.order, index))
        heapq.heappush(self.opening, (self.step + 1 + blocks * bs - prompt, self.order, index))

    def _end_rows(self) -> None:
        """The rows whose last token this step sampled, in row order: their blocks back to the pool."""
        while self.ending and self.ending[0][0] == self.step:
            _, _, index = heapq.heappop(self.ending)
            first, prompt, blocks = self.live.pop(index)
            self.rows -= 1
            self.context -= prompt + self.step - first
            self.used -= blocks
            self.finished.append(Finished(index, self.scheduled.pop(index), first, self.step))
