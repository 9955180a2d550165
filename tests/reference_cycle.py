"""An independent model of one configuration of forge's engine, event by event: a test oracle, and the
measure of how fast a simulation of it can be.

The configuration: ``scheduler=fcfs``, ``kvcache=paged`` without prefix caching (one group), a simulated
clock whose cost model is a ``SummedCostModel`` (``clock=simulated``), ``model=synthetic
model.timing_only=true``, requests that run to their length limit (EOS ignored), whole prompts admitted in
one chunk, no preemption, replicas behind ``round_robin`` (request i, in arrival order, on replica i mod N).

Each replica keeps only aggregates: the running rows' count, the sum of their computed tokens, the blocks
in use, and two heaps of events (the step at which a row finishes, the step at which a row's next decode
opens a block). A step costs O(1) plus its events: no row is touched unless it is admitted, opens a block or
finishes. A request's token times are a slice of its replica's step end times (a running row decodes every
step). ``replica_frames`` returns None where the run leaves the modelled configuration (a prompt cut into
chunks, a decode that finds no free block, a request that can never fit): the engine's general paths decide
those. ``tests/test_reference_cycle.py`` compares these frames with the engine's, bit for bit.

    python tests/reference_cycle.py --requests 1000000 --replicas 16 --rate 1024

prints the CPU-seconds of the model alone over the workload ``python -m benchmarks.cluster_scale`` runs."""

from __future__ import annotations

import argparse
import heapq
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forge.sim.step_sums import StepSums, SummedCostModel

STEP_COLUMNS = (
    "step", "start_time", "end_time", "num_seqs", "num_tokens", "num_prefill_tokens", "num_decode_tokens",
    "num_waiting", "num_running", "kv_usage", "kv_token_slots", "kv_internal_frag_slots", "kv_free_slots",
)  # fmt: skip
"""The columns of ``steps.parquet`` the model computes (the others are 0, or the pool's size)."""


@dataclass(frozen=True)
class Arrival:
    """One request as the model reads it: id, arrival time (s), prompt tokens, tokens to generate, priority."""

    request_id: str
    time: float
    prompt: int
    output: int
    priority: int = 0


@dataclass(frozen=True)
class Limits:
    """The replica's limits: the step's token budget, ``max_num_seqs``, the KV pool (blocks, block size),
    ``max_model_len``, whether a prompt may be cut into chunks, and the admission watermark in blocks."""

    budget: int
    max_num_seqs: int
    num_blocks: int
    block_size: int
    max_model_len: int
    chunked_prefill: bool = True
    watermark_blocks: float = 0.0


class LeftTheModel(Exception):
    """The run reached a case the model does not cover (the engine's general paths take it)."""


class Replica:
    """One replica's state: the aggregates, the event heaps, and what it recorded. At most one request is
    part-way through its prompt (``prefilling``: FCFS cuts only the last admission, and continues it first)."""

    def __init__(self, limits: Limits, cost: SummedCostModel) -> None:
        self.limits, self.cost = limits, cost
        self.now, self.step, self.rows, self.context, self.used, self.seq = 0.0, 0, 0, 0, 0, 0
        self.prefilling: tuple[int, int, int] | None = None  # (request index, computed, blocks)
        self.finishing: list[tuple[int, int, int]] = []  # (step, admission order, request index)
        self.opening: list[tuple[int, int, int]] = []
        self.live: dict[int, list[int]] = {}  # request index -> [first step, prompt, blocks]
        self.scheduled: dict[int, float] = {}  # request index -> the start of the step that admitted it
        self.ends: list[float] = []
        self.steps: list[tuple[float, ...]] = []
        self.finished: list[tuple[int, float, int, int]] = []  # (index, scheduled at, first step, last step)

    def run(self, arrivals: list[Arrival]) -> None:
        waiting: list[int] = []
        i = 0
        while i < len(arrivals) or self.rows or waiting or self.prefilling:
            if not self.rows and not waiting and not self.prefilling and arrivals[i].time > self.now:
                self.now = arrivals[i].time  # idle until the next arrival
            while i < len(arrivals) and arrivals[i].time <= self.now:
                waiting.append(i)
                i += 1
            self._step(arrivals, waiting)

    def _step(self, arrivals: list[Arrival], waiting: list[int]) -> None:
        start, decodes = self.now, self.rows
        partial = self.prefilling[1] if self.prefilling is not None else 0  # not a decode's context
        self._open_blocks()
        chunks = self._continue(arrivals)  # (index, first position, tokens)
        budget = self.limits.budget - decodes - sum(c[2] for c in chunks)
        chunks += self._admit(arrivals, waiting, start, budget, decodes + len(chunks))
        tokens = decodes + sum(c[2] for c in chunks)
        self.now = start + self._time(decodes, self.context - partial + decodes, chunks, arrivals, tokens)
        self.ends.append(self.now)
        self.context += decodes
        for index, first, n in chunks:
            self.context += n
            if first + n == arrivals[index].prompt:
                self._join(index, arrivals[index])
        self._finish()
        bs, total = self.limits.block_size, self.limits.num_blocks
        free = total - self.used
        running = self.rows + (self.prefilling is not None)
        self.steps.append(
            (self.step, start, self.now, decodes + len(chunks), tokens, tokens - decodes, decodes, len(waiting),
             running, 1.0 - free * bs / (total * bs), self.context, self.used * bs - self.context, free * bs)
        )  # fmt: skip
        self.step += 1

    def _open_blocks(self) -> None:
        """The blocks this step's decodes open, in row (admission) order."""
        while self.opening and self.opening[0][0] == self.step:
            _, order, index = heapq.heappop(self.opening)
            row = self.live.get(index)
            if row is None:
                continue  # it finished
            if self.used == self.limits.num_blocks:
                raise LeftTheModel("a decode finds no free block (the engine preempts)")
            self.used += 1
            row[2] += 1
            heapq.heappush(self.opening, (self.step + self.limits.block_size, order, index))

    def _continue(self, arrivals: list[Arrival]) -> list[tuple[int, int, int]]:
        """The next chunk of the prompt part-way through (running requests go before admissions)."""
        if self.prefilling is None:
            return []
        index, computed, blocks = self.prefilling
        n = min(arrivals[index].prompt - computed, self.limits.budget - self.rows)
        return [self._take(index, computed, n, blocks, arrivals[index].prompt)] if n > 0 else []

    def _admit(
        self, arrivals: list[Arrival], waiting: list[int], start: float, budget: int, running: int
    ) -> list[tuple[int, int, int]]:
        """FCFS admissions within ``budget`` while fewer than ``max_num_seqs`` run (``running`` so far)."""
        lim, chunks = self.limits, list[tuple[int, int, int]]()
        while waiting and budget > 0 and running + len(chunks) < lim.max_num_seqs:
            a = arrivals[waiting[0]]
            if a.prompt > budget and not lim.chunked_prefill:
                break
            n = min(a.prompt, budget)
            blocks = -(-n // lim.block_size)
            free = lim.num_blocks - self.used - blocks
            if free < 0 or (lim.watermark_blocks and free < lim.watermark_blocks):
                if not self.rows and not chunks and self.prefilling is None:
                    raise LeftTheModel("a request that does not fit in an empty pool")
                break
            self.scheduled[waiting[0]] = start
            chunks.append(self._take(waiting.pop(0), 0, n, 0, a.prompt))
            budget -= n
        return chunks

    def _take(self, index: int, computed: int, n: int, blocks: int, prompt: int) -> tuple[int, int, int]:
        """Blocks for the chunk of ``n`` prompt tokens from position ``computed``; the request is part-way
        through its prompt after it, or joins the decodes."""
        need = -(-(computed + n) // self.limits.block_size) - blocks
        if self.used + need > self.limits.num_blocks:
            raise LeftTheModel("a prompt chunk finds no free block")
        self.used += need
        self.prefilling = (index, computed + n, blocks + need) if computed + n < prompt else None
        return index, computed, n

    def _time(
        self, decodes: int, context: int, chunks: list[tuple[int, int, int]], arrivals: list[Arrival], tokens: int
    ) -> float:
        """The step's time, from the sums ``StepSums.of_sched`` takes (``decodes`` rows whose contexts after the
        step sum to ``context``, then the chunks in row order)."""
        if not chunks:
            time_of_decodes = self.cost.decode_step_time(decodes, context)
            assert time_of_decodes is not None
            return time_of_decodes
        num_decodes, decode_context, prefills, query_sq, pairs, cached = decodes, context, 0, 0, 0.0, 0
        sampled = decodes
        for index, first, q in chunks:
            end = first + q
            sampled += end == arrivals[index].prompt
            if q == 1:
                num_decodes, decode_context = num_decodes + 1, decode_context + end
            else:
                prefills, query_sq, pairs = prefills + 1, query_sq + q * q, pairs + q * (end - (q - 1) / 2)
                cached += q * first
        sums = StepSums(tokens, num_decodes, decode_context, prefills, query_sq, pairs, sampled, cached)
        return self.cost.time_of(sums)

    def _join(self, index: int, a: Arrival) -> None:
        """A request whose prompt this step completed: its first token now, a decode from the next step."""
        bs = self.limits.block_size
        blocks = -(-a.prompt // bs)
        output = min(a.output, self.limits.max_model_len - a.prompt)
        self.live[index] = [self.step, a.prompt, blocks]
        self.rows, self.seq = self.rows + 1, self.seq + 1
        heapq.heappush(self.finishing, (self.step + output - 1, self.seq, index))
        heapq.heappush(self.opening, (self.step + 1 + blocks * bs - a.prompt, self.seq, index))

    def _finish(self) -> None:
        while self.finishing and self.finishing[0][0] == self.step:
            _, _, index = heapq.heappop(self.finishing)
            first, prompt, blocks = self.live.pop(index)
            self.rows -= 1
            self.context -= prompt + self.step - first
            self.used -= blocks
            self.finished.append((index, self.scheduled.pop(index), first, self.step))


def replica_frames(
    arrivals: list[Arrival], replicas: int, limits: Limits, cost: SummedCostModel
) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(requests, steps) frames as forge's ``requests.parquet`` / ``steps.parquet`` hold them (the columns
    the model computes; steps replica by replica, requests in arrival order), or None where the run
    leaves the modelled configuration."""
    ordered = sorted(arrivals, key=lambda a: a.time)
    per = [ordered[r::replicas] for r in range(replicas)]
    runs = []
    try:
        for own in per:
            replica = Replica(limits, cost)
            replica.run(own)
            runs.append(replica)
    except LeftTheModel:
        return None
    steps = pd.concat(
        [pd.DataFrame(r.steps, columns=list(STEP_COLUMNS)).assign(replica=i) for i, r in enumerate(runs)],
        ignore_index=True,
    )
    rows = [_request_row(own, r, i, e) for i, (own, r) in enumerate(zip(per, runs, strict=True)) for e in r.finished]
    requests = pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))
    return requests.sort_values("arrival_time", kind="stable", ignore_index=True), steps


REQUEST_COLUMNS = (
    "request_id", "arrival_time", "first_scheduled_time", "first_token_time", "finish_time", "num_prompt_tokens",
    "num_output_tokens", "priority", "queue_time", "ttft", "e2e", "tpot", "itl", "replica",
)  # fmt: skip


def _request_row(own: list[Arrival], replica: Replica, index: int, entry: tuple[int, float, int, int]) -> tuple:
    i, scheduled, first, last = entry
    a = own[i]
    times = np.array(replica.ends[first : last + 1])
    n = len(times)
    tpot = (times[-1] - times[0]) / (n - 1) if n > 1 else np.nan
    return (a.request_id, a.time, scheduled, times[0], times[-1], a.prompt, n, a.priority, scheduled - a.time,
            times[0] - a.time, times[-1] - a.time, tpot, np.diff(times), index)  # fmt: skip


def main() -> None:
    import random

    from forge.models.synthetic import SyntheticModel
    from forge.sim.clock import SimulatedClock

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--rate", type=float, default=1024.0)
    args = p.parse_args()
    clock = SimulatedClock("h100", "auto")
    clock.bind(SyntheticModel(timing_only=True).dims)
    assert isinstance(clock.cost_model, SummedCostModel)
    gaps, lengths = random.Random("0/0"), random.Random("0/1")  # the synthetic workload's streams
    t, arrivals = 0.0, []
    for i in range(args.requests):
        t += gaps.expovariate(args.rate)
        arrivals.append(Arrival(f"req-{i:06d}", t, lengths.randint(16, 256), lengths.randint(8, 64)))
    start = time.process_time()
    frames = replica_frames(arrivals, args.replicas, Limits(512, 64, 8192, 16, 2048), clock.cost_model)
    cpu = time.process_time() - start
    assert frames is not None
    per_request = cpu / args.requests * 1e6
    print(f"{args.requests} requests, {len(frames[1])} steps: {cpu:.2f} CPU-s ({per_request:.1f} µs a request)")


if __name__ == "__main__":
    main()
