"""Per-request timestamps and per-step statistics, as tidy DataFrames."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from forge.core.decode_run import DecodeRun
from forge.core.outputs import SchedulerOutput
from forge.core.request import Request
from forge.kvcache.base import KVUsage
from forge.results.ragged import inner_gaps, joined
from forge.results.step_log import StepLog
from forge.results.step_log import StepRecord as StepRecord  # (re-exported: it was defined here)
from forge.sched.step_outputs import StepOutputs

if TYPE_CHECKING:  # pandas is imported where frames are built: the serving path never builds one
    import pandas as pd


@dataclass(slots=True)
class RequestTimeline:
    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    priority: int
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    finish_time: float | None = None
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0


_TOKEN_TIMES = attrgetter("token_times")
_REQUEST_ID = attrgetter("request_id")
_FINISH_REASON = attrgetter("finish_reason")
_TIMES = ("arrival_time", "first_scheduled_time", "finish_time")
_COUNTS = ("num_prompt_tokens", "num_output_tokens", "num_cached_tokens", "num_preemptions", "priority")
"""``RequestTimeline``'s integer fields, the frame's int64 columns in this order."""

SUMMARY_STEP_COLUMNS = (
    ("step", np.int64),
    ("num_preempted", np.int64),
    ("kv_usage", np.float64),
    ("num_seqs", np.int64),
)
"""The step columns ``summarize`` reads, with their dtypes as in ``steps_frame``."""


class MetricsRecorder:
    """Collects what happened; turns it into DataFrames and a summary. Holds no engine state."""

    def __init__(self) -> None:
        self.requests: dict[str, RequestTimeline] = {}
        self.steps = StepLog()  # column-wise; a Sequence of StepRecord
        self.counters: dict[str, int] = {}
        self._unscheduled: dict[str, RequestTimeline] = {}  # arrived, not yet scheduled

    def on_arrival(self, request: Request, t: float) -> None:
        tl = RequestTimeline(request.request_id, t, request.num_prompt_tokens, request.priority)
        self.requests[request.request_id] = self._unscheduled[request.request_id] = tl

    def on_event_run_end(self, request_id: str, scheduled: float, token_times: list[float], reason: str) -> None:
        """A request of an event run (``forge.engine.event_runs``) that arrived (``on_arrival``), was first
        scheduled at ``scheduled``, sampled a token at each of ``token_times`` and ended at the last."""
        tl = self._unscheduled.pop(request_id)
        tl.first_scheduled_time = scheduled
        tl.token_times = token_times
        tl.num_output_tokens = len(token_times)
        tl.finish_time = token_times[-1]
        tl.finish_reason = reason

    def on_event_run_steps(self, steps: StepLog) -> None:
        """The steps of an event run, numbered from 0: this recorder's, which has recorded none."""
        if len(self.steps):
            raise ValueError(f"an event run's steps go to a recorder with no steps; this one has {len(self.steps)}")
        self.steps = steps

    def on_abort(self, request_id: str, reason: str = "abort") -> None:
        """A request its caller ended between steps (``Engine.stop``: a pruned beam): finished with
        ``reason`` at the end of the last step recorded."""
        tl = self.requests[request_id]
        self._unscheduled.pop(request_id, None)
        tl.finish_time = self.steps[-1].end_time if self.steps else tl.arrival_time
        tl.finish_reason = reason

    def on_step(
        self,
        sched: SchedulerOutput,
        outputs: StepOutputs,
        requests: dict[str, Request],
        start: float,
        end: float,
        kv: KVUsage,
        num_running: int,
    ) -> None:
        timelines, pending = self.requests, self._unscheduled  # pending: arrived, not yet scheduled
        if pending and sched.decodes.request_ids:
            for rid in list(filter(pending.__contains__, sched.decodes.request_ids)):
                pending.pop(rid).first_scheduled_time = start
        prefill = drafts = accepted = 0
        for c in sched.chunks:  # the decodes compute one output token each: no prompt, no drafts
            if c.request_id in pending:
                pending.pop(c.request_id).first_scheduled_time = start
            n_prompt = timelines[c.request_id].num_prompt_tokens
            if c.start < n_prompt:
                prefill += min(c.start + c.num_tokens, n_prompt) - c.start
            drafts += c.num_draft_tokens
        decode = sched.num_batched_tokens - prefill - drafts
        decoded = outputs.decoded  # the plain decodes' outputs are their requests (one new token each)
        for r in decoded:  # (a plain loop: faster than zip over map(timelines.__getitem__, ...) on 3.11)
            tl = timelines[r.request_id]
            tl.token_times.append(end)
            tl.num_output_tokens = len(r.output_token_ids)
            if r.num_cached_tokens > tl.num_cached_tokens:
                tl.num_cached_tokens = r.num_cached_tokens
        for r in outputs.finished_decodes:
            tl = timelines[r.request_id]
            tl.finish_time = end
            tl.finish_reason = r.status.value
            tl.num_preemptions = requests[r.request_id].num_preemptions
        for out in outputs.others:
            tl = timelines[out.request_id]
            n_new = len(out.new_token_ids)
            if n_new == 1:
                tl.token_times.append(end)
            else:
                tl.token_times.extend([end] * n_new)
                accepted += max(n_new - 1, 0)
            tl.num_output_tokens = len(out.token_ids)
            if out.num_cached_tokens > tl.num_cached_tokens:
                tl.num_cached_tokens = out.num_cached_tokens
            if out.finished:
                tl.finish_time = end
                tl.finish_reason = out.finish_reason
                tl.num_preemptions = requests[out.request_id].num_preemptions
        self.steps.append(  # a plain tuple in StepRecord's field order (StepLog)
            (
                len(self.steps),
                start,
                end,
                sched.num_rows,
                sched.num_batched_tokens,
                prefill,
                decode,
                drafts,
                accepted,
                sched.num_waiting,
                num_running,
                len(sched.preempted_ids),
                kv.used_fraction,
                kv.token_slots,
                kv.reserved_slots,
                kv.internal_frag_slots,
                kv.external_frag_slots,
                kv.free_slots,
                kv.total_slots,
            )
        )

    def on_decode_run(self, run: DecodeRun, start: float, ends: list[float], kv: list[KVUsage]) -> None:
        """``on_step`` for each step of ``run`` (taken from ``start``; step j ends at ``ends[j]``, its
        KV usage ``kv[j]``), its rows' new tokens appended and its finishing rows finished."""
        timelines = self.requests
        # (a decode never changes a request's num_cached_tokens: only admitting it does, in a step)
        taken, requests, num_steps = len(ends), run.requests, run.num_steps
        for r, n in zip(requests, num_steps, strict=True):
            tl = timelines[r.request_id]
            tl.token_times += ends if n == taken else ends[:n]
            tl.num_output_tokens = len(r.output_token_ids)
        for i in run.finish_order:
            r = requests[i]
            tl = timelines[r.request_id]
            tl.finish_time = ends[num_steps[i] - 1]
            tl.finish_reason = r.status.value
            tl.num_preemptions = r.num_preemptions
        record, step, rows = self.steps.append, len(self.steps), len(requests)
        # a step's rows are those running after the step before (a row that is not finishing runs every step)
        for end, u, running in zip(ends, kv, run.running_after(), strict=True):
            slots = (u.token_slots, u.reserved_slots, u.internal_frag_slots, u.external_frag_slots, u.free_slots)
            record((step, start, end, rows, rows, 0, rows, 0, 0, 0, running, 0, u.used_fraction, *slots, u.total_slots))
            step += 1
            start, rows = end, running

    def requests_frame(self) -> pd.DataFrame:
        """One row per request; built column-wise (a 10,000-request run has millions of token times)."""
        import pandas as pd

        return pd.DataFrame(self.request_columns())

    def steps_frame(self) -> pd.DataFrame:
        """One row per step (``StepRecord``'s fields)."""
        return self.steps.frame()

    def summary(self, counters: dict[str, int]) -> dict[str, Any]:
        """``summarize`` of this run's frames, computed from its columns without pandas (the same numbers):
        of the steps, only the columns it reads."""
        steps = {name: self.steps.column(name).astype(dtype, copy=False) for name, dtype in SUMMARY_STEP_COLUMNS}
        return summarize(self.request_columns(), steps, counters)

    def request_columns(self) -> dict[str, Any]:
        """``requests_frame``'s columns: numpy arrays, and lists for the ids, reasons and ITL arrays."""
        tls = list(self.requests.values())
        n = len(tls)
        token_times = list(map(_TOKEN_TIMES, tls))
        lens = np.fromiter(map(len, token_times), dtype=np.int64, count=n)
        ends = np.cumsum(lens)
        starts = ends - lens
        times = np.fromiter(itertools.chain.from_iterable(token_times), dtype=float, count=int(ends[-1]) if n else 0)
        del token_times
        has = lens > 0
        first, last = np.full(n, np.nan), np.full(n, np.nan)
        first[has], last[has] = times[starts[has]], times[ends[has] - 1]
        arrival, scheduled, finish = _fields(tls, _TIMES, float)  # None -> nan
        counts = _fields(tls, _COUNTS, np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(lens > 1, (last - first) / (lens - 1), np.nan)
        return {
            "request_id": list(map(_REQUEST_ID, tls)),
            "arrival_time": arrival,
            "first_scheduled_time": scheduled,
            "first_token_time": first,
            "finish_time": finish,
            **dict(zip(_COUNTS, counts, strict=True)),
            "finish_reason": list(map(_FINISH_REASON, tls)),
            "queue_time": scheduled - arrival,
            "ttft": first - arrival,
            "e2e": finish - arrival,
            "tpot": tpot,
            # float64 arrays (views of one array), as a parquet list column reads back: several times
            # faster to write than Python lists (``forge.results.ragged``)
            "itl": inner_gaps(times, lens),
        }


def _fields(timelines: list[RequestTimeline], names: tuple[str, ...], dtype: Any) -> np.ndarray:
    """Fields ``names`` of every timeline, an array of ``dtype`` per field (None -> nan); read in one
    pass over the timelines (a million of them, scattered in memory: one visit each, not one a field)."""
    rows = list(map(attrgetter(*names), timelines)) if timelines else np.empty((0, len(names)))
    return np.array(rows, dtype=dtype).T.copy()


def percentiles(values: Any, prefix: str, owned: bool = False) -> dict[str, float]:
    """Mean, p50, p90 and p99 of ``values`` (in ms, NaN skipped). ``owned``: ``values`` is an array no one
    else reads, which may be reordered in place (a million requests' ITLs: no copy of them)."""
    arr = np.asarray(values, dtype=float)  # None -> nan
    missing = np.isnan(arr)
    if missing.any():
        arr, owned = arr[~missing], True
    del missing
    if arr.size == 0:
        return {}
    out = {f"mean_{prefix}_ms": float(arr.mean() * 1e3)}
    # one partition for the three; in place when the array is a copy of ours (the same values either way)
    for p, value in zip((50, 90, 99), np.percentile(arr, (50, 90, 99), overwrite_input=owned), strict=True):
        out[f"p{p}_{prefix}_ms"] = float(value * 1e3)
    return out


def summarize(requests: Any, steps: Any, counters: dict[str, int]) -> dict[str, Any]:
    """Headline numbers, with ``vllm bench serve``-style keys, from ``requests_frame`` and ``steps_frame``
    (DataFrames, or their columns: ``MetricsRecorder.request_columns`` and arrays per ``StepRecord`` field).
    Missing values (NaN) are skipped."""

    def column(frame: Any, name: str) -> np.ndarray:
        return np.asarray(frame[name])

    arrival, finish = column(requests, "arrival_time"), column(requests, "finish_time")
    n_requests = len(arrival)
    start = float(np.nanmin(arrival)) if n_requests else math.nan
    end = float(np.nanmax(finish)) if n_requests else math.nan
    duration = max(end - start, 1e-12)
    n_in = int(column(requests, "num_prompt_tokens").sum())
    n_out = int(column(requests, "num_output_tokens").sum())
    itl = joined(list(requests["itl"]))  # a new array: ``percentiles`` may reorder it
    n_steps = len(steps["step"]) if len(steps) else 0
    summary: dict[str, Any] = {
        "num_requests": n_requests,
        "duration_s": duration,
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": n_requests / duration,
        "output_throughput": n_out / duration,
        "total_token_throughput": (n_in + n_out) / duration,
        "num_steps": n_steps,
        "num_preemptions": int(column(steps, "num_preempted").sum()) if n_steps else 0,
        "peak_kv_usage": float(np.nanmax(column(steps, "kv_usage"))) if n_steps else 0.0,
        "mean_batch_size": float(np.nanmean(column(steps, "num_seqs"))) if n_steps else 0.0,
    }
    for key in ("ttft", "tpot", "e2e"):
        summary.update(percentiles(requests[key], key))
    summary.update(percentiles(itl, "itl", owned=True))
    summary.update(counters)
    return summary
