"""A cluster's records: the replicas' request and step frames merged with a ``replica`` column, and
the summary's per-replica load balance."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from forge.cluster.loop import Replica
from forge.engine.gc_pause import rare_gc
from forge.results.step_log import StepRecord
from forge.spec.base import SpecDecodeStats

REQUEST_TIMES = ("arrival_time", "first_scheduled_time", "first_token_time", "finish_time")
STEP_TIMES = ("start_time", "end_time")


def merged_frames(replicas: Sequence[Replica], column: str = "replica") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(requests, steps) of every replica, each row with its replica's index in ``column``, times in
    seconds from the run's start; one simulated replica: its frames as the engine records them, plus
    that column. Requests are in arrival order (stable: a
    replica's own order among equal times), steps replica by replica."""
    with rare_gc():  # a million requests' ITL arrays: no collector passes over the run's records meanwhile
        req_df = pd.DataFrame(merged_requests(replicas, column), copy=False)
        return req_df, merged_steps(replicas, column)


def merged_requests(replicas: Sequence[Replica], column: str = "replica") -> dict[str, Any]:
    """``merged_frames``' requests as columns: the recorders' ``request_columns`` joined (times less
    each replica's offset) with ``column``, sorted by arrival when there are several replicas (one
    stable sort of the joined columns, not of a frame per replica)."""
    parts = [r.engine.recorder.request_columns() for r in replicas]
    counts = [len(part["arrival_time"]) for part in parts]
    columns: dict[str, Any] = {}
    for name in parts[0]:
        pieces = [
            _shifted(part[name], r.offset) if name in REQUEST_TIMES else part[name]
            for part, r in zip(parts, replicas, strict=True)
        ]
        columns[name] = _joined(pieces)
    del parts
    columns[column] = np.repeat(np.array([r.index for r in replicas], dtype=np.int64), counts)
    if len(replicas) == 1:
        return columns
    order = np.argsort(columns["arrival_time"], kind="stable")
    return {name: _taken(values, order) for name, values in columns.items()}


def merged_steps(replicas: Sequence[Replica], column: str = "replica") -> pd.DataFrame:
    """The replicas' steps frames, one after the other, with ``column``: built a field at a time from
    the recorders' columns (``StepLog``) when every replica took a step, so only the merged frame is
    held, not each replica's as well; else (a replica took none) by concatenating their frames."""
    logs = [r.engine.recorder.steps for r in replicas]
    if not all(len(log) for log in logs):
        steps = [
            _shifted_frame(r.engine.recorder.steps_frame(), STEP_TIMES, r.offset).assign(**{column: r.index})
            for r in replicas
        ]
        return pd.concat(steps, ignore_index=True) if len(steps) > 1 else steps[0]
    columns: dict[str, np.ndarray] = {}
    for name in StepRecord._fields:
        parts = [log.column(name) for log in logs]
        if name in STEP_TIMES:
            parts = [part - r.offset if r.offset != 0 else part for part, r in zip(parts, replicas, strict=True)]
        columns[name] = np.concatenate(parts) if len(parts) > 1 else parts[0]
    index = np.array([r.index for r in replicas], dtype=np.int64)
    columns[column] = np.repeat(index, [len(log) for log in logs])
    return pd.DataFrame(columns, copy=False)


def _shifted_frame(frame: pd.DataFrame, columns: tuple[str, ...], offset: float) -> pd.DataFrame:
    """``frame`` with its time ``columns`` in the cluster's time (the replica's clock less ``offset``,
    its time when the run started: 0 under a simulated clock, which leaves the frame as it is)."""
    if offset == 0 or not len(frame):
        return frame
    return frame.assign(**{c: frame[c] - offset for c in columns})


def _shifted(times: np.ndarray, offset: float) -> np.ndarray:
    """``times`` in the cluster's time (``_shifted_frame``'s rule for one column)."""
    return times - offset if offset != 0 and len(times) else times


def _joined(pieces: list[Any]) -> Any:
    """Columns' pieces one after another: arrays joined, lists chained (one piece: itself)."""
    if len(pieces) == 1:
        return pieces[0]
    if isinstance(pieces[0], np.ndarray):
        return np.concatenate(pieces)
    return list(itertools.chain.from_iterable(pieces))


def _taken(values: Any, order: np.ndarray) -> Any:
    """``values`` (an array or a list) in ``order``."""
    if isinstance(values, np.ndarray):
        return values[order]
    return list(map(values.__getitem__, order.tolist()))


def summed_counters(replicas: Sequence[Replica]) -> dict[str, int]:
    """The KV caches' counters (prefix-cache queries and hits, ...) added over the replicas."""
    total: dict[str, int] = {}
    for r in replicas:
        for key, value in r.engine.scheduler.kv.stats().items():
            total[key] = total.get(key, 0) + value
    return total


def load_balance(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    replicas: Sequence[Replica],
    duration: float,
    column: str = "replica",
    prefix: str = "replica",
) -> dict[str, Any]:
    """Per replica: requests, tokens (prompt + output), busy time and busy fraction (of ``duration``,
    the run's); and, for each, max / mean over the replicas (1.0: perfectly even), as
    ``{prefix}_{requests,tokens,busy}_max_over_mean``, with the list under ``per_{prefix}``."""
    requests = requests[[column, "num_prompt_tokens", "num_output_tokens"]]  # (filtered per replica: only these)
    steps = steps[[column, "start_time", "end_time"]] if len(steps) else steps
    rows = []
    for r in replicas:
        mine = requests[requests[column] == r.index]  # (prefill or decode tokens: the whole request's)
        own = steps[steps[column] == r.index] if len(steps) else steps
        busy = float((own["end_time"] - own["start_time"]).sum()) if len(own) else 0.0
        tokens = int(mine["num_prompt_tokens"].sum() + mine["num_output_tokens"].sum())
        rows.append(
            {
                "replica": r.index,
                "hardware": r.hardware,
                "requests": len(mine),
                "tokens": tokens,
                "busy_s": busy,
                "busy_fraction": busy / duration if duration > 0 else 0.0,
            }
        )
    out: dict[str, Any] = {f"per_{prefix}": rows, f"{prefix}s": len(rows)}
    for key, field in (("requests", "requests"), ("tokens", "tokens"), ("busy", "busy_s")):
        values = np.array([row[field] for row in rows], dtype=float)
        mean = float(values.mean())
        out[f"{prefix}_{key}_max_over_mean"] = float(values.max() / mean) if mean > 0 else 1.0
    return out


def merged_spec_stats(replicas: Sequence[Replica]) -> SpecDecodeStats | None:
    """The replicas' speculative-decoding counters added up (None: no replica has a drafter)."""
    parts = [r.engine.spec_stats for r in replicas if r.engine.drafter is not None]
    if not parts:
        return None
    width = max(len(p.drafts_per_position) for p in parts)

    def added(name: str) -> list[int]:
        return [sum(getattr(p, name)[i] for p in parts if i < len(getattr(p, name))) for i in range(width)]

    return SpecDecodeStats(
        num_drafts=sum(p.num_drafts for p in parts),
        num_draft_tokens=sum(p.num_draft_tokens for p in parts),
        num_accepted_tokens=sum(p.num_accepted_tokens for p in parts),
        drafts_per_position=added("drafts_per_position"),
        accepted_per_position=added("accepted_per_position"),
    )
