"""experiments/seeds.py: a study's per-seed rows become one row per configuration with the mean and the
95% CI half-width (forge.results.stats), and the markdown table shows them as "mean ± half-width"."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.seeds import aggregate, ci, ci_table, differs, with_seeds
from forge.results.stats import mean_ci95


def test_with_seeds_runs_every_point_once_per_seed() -> None:
    assert with_seeds([["scheduler=fcfs"], ["scheduler=sjf"]], (1, 2, 3)) == [
        ["scheduler=fcfs", "seed=1"],
        ["scheduler=fcfs", "seed=2"],
        ["scheduler=fcfs", "seed=3"],
        ["scheduler=sjf", "seed=1"],
        ["scheduler=sjf", "seed=2"],
        ["scheduler=sjf", "seed=3"],
    ]


def per_seed() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "scheduler": ["sjf", "sjf", "sjf", "fcfs", "fcfs", "fcfs"],
            "seed": [1, 2, 3, 1, 2, 3],
            "ttft": [1.0, 2.0, 3.0, 10.0, 11.0, 12.0],
            "slo_met": [True, True, False, True, True, True],
        }
    )


def test_aggregate_gives_mean_and_ci_per_configuration_in_first_seen_order() -> None:
    agg = aggregate(per_seed(), ["scheduler"], ["ttft", "slo_met"])
    assert list(agg["scheduler"]) == ["sjf", "fcfs"] and list(agg["n_seeds"]) == [3, 3]
    expected = mean_ci95([1.0, 2.0, 3.0])
    assert agg.loc[0, "ttft"] == pytest.approx(2.0) and agg.loc[0, "ttft_ci95"] == pytest.approx(expected.half_width)
    assert agg.loc[0, "slo_met"] == pytest.approx(2 / 3)
    assert ci(agg.iloc[0], "ttft") == expected
    assert differs(agg.iloc[0], agg.iloc[1], "ttft")  # [2 ± 2.5] vs [11 ± 2.5]


def test_one_seed_has_no_interval() -> None:
    agg = aggregate(per_seed().iloc[:1], ["scheduler"], ["ttft"])
    assert math.isnan(float(agg["ttft_ci95"].iloc[0]))
    assert "| sjf | 1 |" in ci_table(agg, ["scheduler"], ["ttft"])


def test_ci_table_writes_mean_plus_minus_half_width_and_seed_shares() -> None:
    agg = aggregate(per_seed(), ["scheduler"], ["ttft", "slo_met"])
    lines = ci_table(agg, ["scheduler"], ["ttft"], shares=["slo_met"]).splitlines()
    assert lines[0] == "| scheduler | ttft | slo_met |"
    assert lines[2] == f"| sjf | {mean_ci95([1.0, 2.0, 3.0])} | 2/3 |" and lines[2].count("±") == 1
    assert lines[3].endswith("| 3/3 |")
