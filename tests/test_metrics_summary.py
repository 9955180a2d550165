"""``MetricsRecorder.summary`` (numpy columns, no pandas) equals ``summarize`` of the recorder's DataFrames."""

from __future__ import annotations

import pytest

from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests
from forge.results.metrics import MetricsRecorder, summarize

BASE = ["model=synthetic", "clock=simulated", "progress=false", "report=false"]
CASES = {
    "poisson": ["workload=poisson", "workload.num_requests=30"],
    "preemption": ["workload=sharegpt", "workload.num_requests=200", "kvcache.num_blocks=300"],
    "priorities": ["workload=poisson", "workload.num_requests=30", "scheduler=priority", "workload.num_priorities=3"],
    "one-token-outputs": ["workload=fixed", "workload.num_requests=8", "workload.output_len.value=1"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_summary_equals_summarize_of_the_frames(case: str) -> None:
    cfg = compose_config([*BASE, *CASES[case]])
    engine = build_engine(cfg)
    engine.run(workload_requests(cfg, engine))
    rec, counters = engine.recorder, dict(engine.scheduler.kv.stats())
    expected = summarize(rec.requests_frame(), rec.steps_frame(), counters)
    assert rec.summary(counters) == expected
    if case == "preemption":
        assert expected["num_preemptions"] > 0


def test_an_empty_recorder_summarises_to_no_steps() -> None:
    summary = MetricsRecorder().summary({})
    assert summary["num_requests"] == 0 and summary["num_steps"] == 0
