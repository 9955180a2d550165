"""The fidelity study regenerates its report end to end (tiny size, into a temporary directory)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def test_fidelity_study_tiny(tmp_path: Path) -> None:
    from experiments.run import main

    main(["fidelity", "--size", "tiny", "--out", str(tmp_path)])
    res = pd.read_csv(tmp_path / "results.csv")
    assert list(res["cost"]) == ["operators", "operators"] and (res["ratio_mean_tpot_ms"] > 0).all()
    assert list(res["arrivals"]) == ["t=0", "vidur"]  # the Poisson rows replay Vidur's own arrivals
    steps = pd.read_csv(tmp_path / "step_times.csv")
    a100 = steps[(steps["hardware"] == "a100") & steps["vidur_ms"].notna()]
    assert len(a100) == 9 and ((a100["operators_ratio"] - 1).abs() < 0.10).all()
    readme = (tmp_path / "README.md").read_text()
    assert "python -m experiments.run" in readme and "Per-shape step time" in readme
