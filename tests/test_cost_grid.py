"""experiments/cost_grid.py: the grid of batch shapes (issue 35), forge's dense layer against a Vidur
mlp.csv, and the per-region distribution of forge ÷ Vidur."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments import cost_grid
from forge.sim.vidur_profile import MLP_OPERATORS


def test_the_grid_spans_the_regions_issue_35_names() -> None:
    grid = cost_grid.shapes()
    regions = {r: [s for reg, _, s in grid if reg == r] for r in ("prefill", "decode", "mixed")}
    assert len(grid) >= 500 and all(regions.values())
    prefill = regions["prefill"]
    assert {len(s.query_lens) for s in prefill} == {1, 2, 4, 8}
    assert {s.seq_lens[0] - s.query_lens[0] for s in prefill} == set(cost_grid.CACHED)
    assert min(s.query_lens[0] for s in prefill) == 16 and max(s.query_lens[0] for s in prefill) == 4096
    assert all(sum(s.query_lens) <= 4096 and max(s.seq_lens) <= 4096 for s in prefill)
    assert all(sum(s.seq_lens) - sum(s.query_lens) <= 4096 for s in prefill)  # Vidur's table of cached context
    decode = regions["decode"]
    assert {len(s.query_lens) for s in decode} == set(cost_grid.DECODE_BATCH) == {*cost_grid.DECODE_BATCH, 1, 256}
    assert {s.seq_lens[0] for s in decode} == set(cost_grid.CONTEXT)
    assert all(s.query_lens[0] > 1 and set(s.query_lens[1:]) == {1} for s in regions["mixed"])


def test_dense_rows_compare_forge_with_the_profiled_operator_sum(tmp_path: Path) -> None:
    m = cost_grid.model()
    rows = []
    for n in (1, 512, 4096):
        row = {"n_head": 32, "n_kv_head": 32, "n_embd": 4096, "n_expanded_embd": 11008, "num_tokens": n}
        row |= {"num_tensor_parallel_workers": 1}
        # every operator takes a share of 1.25x forge's dense time: the profile's sum is 1.25x forge's
        share = 1.25 * m.terms(n).dense * 1e3 / len(MLP_OPERATORS)
        rows.append(row | {f"time_stats.{op}.median": share for op in MLP_OPERATORS})
    rows.append(rows[0] | {"num_tensor_parallel_workers": 2, "time_stats.add.median": 99.0})  # another TP: ignored
    path = tmp_path / "mlp.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    got = cost_grid.dense_rows(path)
    assert [r["shape"] for r in got] == ["1 tokens", "512 tokens", "4096 tokens"]
    assert all(r["forge_ms"] / r["vidur_ms"] == pytest.approx(0.8) for r in got)


def test_distribution_reports_median_percentiles_and_the_worst_shape() -> None:
    ratios = [1.0] * 18 + [0.7, 1.2]
    rows = [{"region": "r", "shape": f"s{i}", "vidur_ms": 10.0, "forge_ms": 10.0 * x} for i, x in enumerate(ratios)]
    rows.append({"region": "other", "shape": "only", "vidur_ms": 2.0, "forge_ms": 2.1})
    first, other = cost_grid.distribution(rows)
    assert (first["region"], first["shapes"], first["median"]) == ("r", 20, 1.0)
    assert (first["worst"], first["worst_shape"]) == (pytest.approx(0.7), "s18")
    assert first["within_5pct"] == 0.9 and first["p5"] < 1.0 < first["p95"]
    assert (other["shapes"], other["worst"]) == (1, pytest.approx(1.05))


def test_a_missing_vidur_checkout_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="mlp.csv not found"):
        cost_grid.main(["--vidur-src", str(tmp_path), "--out", str(tmp_path / "out")])


def test_whole_steps_refuse_a_checkout_with_forges_computed_attention(tmp_path: Path) -> None:
    (tmp_path / "ATTENTION_PROFILE").write_text("label=computed\nsha256=" + "0" * 64 + "\n")
    with pytest.raises(SystemExit, match="forge's computed one, not Vidur's measurements"):
        cost_grid.step_rows("/nonexistent/python", tmp_path)
    (tmp_path / "ATTENTION_PROFILE").write_text("label=measured\nsha256=" + "0" * 64 + "\n")
    cost_grid.measured_attention(tmp_path)  # Vidur's own profile: no objection
