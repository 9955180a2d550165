"""A run's request records as they reach ``requests.parquet``: each request's ITLs are the gaps between
its own token times, several replicas' frames merge into arrival order with their integer columns
kept integers, ``write_parquet`` writes the file ``DataFrame.to_parquet`` writes, and ``summarize``
reads ITLs given as arrays or as lists alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from forge.cluster.build import build_pool, build_router, cluster_spec
from forge.cluster.loop import ReplicaPool
from forge.cluster.results import merged_frames, summed_counters
from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests
from forge.results.metrics import summarize
from forge.results.ragged import write_parquet

BASE = ["model=synthetic", "clock=simulated", "progress=false", "report=false"]


def ran_pool(overrides: list[str]) -> ReplicaPool:
    cfg = compose_config([*BASE, *overrides])
    pool = build_pool(cfg, cluster_spec(cfg).pools()[0], build_router(cfg))
    pool.run(workload_requests(cfg, pool.replicas[0].engine))
    return pool


def test_each_requests_itls_are_the_gaps_between_its_token_times() -> None:
    cfg = compose_config([*BASE, "workload.num_requests=60", "workload.output_len.low=1", "workload.output_len.high=4"])
    engine = build_engine(cfg)
    engine.run(workload_requests(cfg, engine))
    frame = engine.recorder.requests_frame()
    timelines = engine.recorder.requests
    assert {len(tl.token_times) for tl in timelines.values()} >= {1}  # one-token requests among them
    rows = zip(frame["request_id"], frame["itl"], frame["first_token_time"], frame["num_output_tokens"], strict=True)
    for request_id, itl, first_token_time, num_output_tokens in rows:
        times = timelines[request_id].token_times
        assert itl.dtype == np.float64
        np.testing.assert_array_equal(itl, np.diff(times))
        assert first_token_time == times[0] and num_output_tokens == len(times)


def test_several_replicas_merge_into_arrival_order() -> None:
    pool = ran_pool(["cluster.replicas=3", "router=least_outstanding", "workload.num_requests=90"])
    merged, _ = merged_frames(pool.replicas)
    frames = [r.engine.recorder.requests_frame().assign(replica=r.index) for r in pool.replicas]
    expected = pd.concat(frames, ignore_index=True).sort_values("arrival_time", kind="stable", ignore_index=True)
    pd.testing.assert_frame_equal(merged, expected)
    assert merged["replica"].nunique() == 3 and merged["arrival_time"].is_monotonic_increasing


def test_a_replica_given_no_request_leaves_the_counts_integers() -> None:
    pool = ran_pool(["cluster.replicas=4", "workload.num_requests=2"])
    merged, _ = merged_frames(pool.replicas)
    assert len(merged) == 2
    for name in ("num_prompt_tokens", "num_output_tokens", "num_cached_tokens", "num_preemptions", "priority"):
        assert merged[name].dtype == np.int64, name


def test_write_parquet_writes_what_to_parquet_writes(tmp_path: Path) -> None:
    pool = ran_pool(["cluster.replicas=2", "workload.num_requests=40"])
    frame, _ = merged_frames(pool.replicas)
    lists = frame.assign(itl=[a.tolist() for a in frame["itl"]])  # not arrays: pandas converts it
    for name, table in (("arrays", frame), ("lists", lists)):
        ours, theirs = tmp_path / f"{name}-ours.parquet", tmp_path / f"{name}-pandas.parquet"
        write_parquet(table, ours)
        table.to_parquet(theirs)
        assert pq.read_schema(ours).equals(pq.read_schema(theirs), check_metadata=True), name
        assert json.loads(pq.read_schema(ours).metadata[b"pandas"]) == json.loads(
            pq.read_schema(theirs).metadata[b"pandas"]
        )
        pd.testing.assert_frame_equal(pd.read_parquet(ours), pd.read_parquet(theirs))


def test_summarize_reads_itls_as_arrays_or_lists() -> None:
    pool = ran_pool(["workload.num_requests=40"])
    frame, steps = merged_frames(pool.replicas)
    counters = summed_counters(pool.replicas)
    lists = frame.assign(itl=[a.tolist() for a in frame["itl"]])
    summary = summarize(frame, steps, counters)
    assert summarize(lists, steps, counters) == summary
    assert summary["mean_itl_ms"] == np.mean(np.concatenate(list(frame["itl"]))) * 1e3
