"""The serving benchmark client against a live server: results, summary keys, report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from benchmarks.serve import arrival_gaps, main
from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer


def test_bench_serve_end_to_end(tmp_path: Path) -> None:
    app, _ = app_from_config(compose_config(["model=synthetic"]), "synthetic")
    out = tmp_path / "bench"
    with BackgroundServer(app) as s:
        summary = main(
            [
                "--url", s.url, "--workload", "gamma", "--num-prompts", "24", "--request-rate", "200",
                "--burstiness", "0.5", "--max-concurrency", "8", "--goodput", "ttft:60000", "e2el:60000",
                "--set", "workload.input_len.high=64", "workload.output_len.high=12",
                "--output-dir", str(out),
            ]
        )  # fmt: skip
    assert summary["completed"] == 24 and summary["failed"] == 0
    assert summary["request_goodput"] == summary["request_throughput"]  # SLOs of a minute: all good
    # the server's own TTFT over the run (its /metrics) beside the client's
    assert 0 < summary["server_mean_ttft_ms"] <= summary["mean_ttft_ms"] + 1.0
    assert summary["client_minus_server_ttft_ms"] == summary["mean_ttft_ms"] - summary["server_mean_ttft_ms"]
    for key in ("mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "std_e2el_ms", "output_throughput"):
        assert math.isfinite(summary[key]), key
    frame = pd.read_parquet(out / "requests.parquet")
    assert len(frame) == 24 and frame["success"].all()
    assert (frame["num_output_tokens"] == frame["output_len"]).all()  # ignore_eos: every drawn length served
    assert json.loads((out / "summary.json").read_text())["completed"] == 24
    assert (out / "report.md").exists() and (out / "latency.png").exists()


def test_arrival_gaps() -> None:
    assert arrival_gaps(3, math.inf, 1.0, 0) == [0.0, 0.0, 0.0]
    gaps = arrival_gaps(20000, 50.0, 0.3, 1)
    assert abs(sum(gaps) / len(gaps) - 1 / 50) < 2e-3
