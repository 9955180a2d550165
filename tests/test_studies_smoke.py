"""A study regenerates its report end to end (tiny size, into a temporary directory)."""

from __future__ import annotations

import pandas as pd


def test_fig2_study_tiny(tmp_path) -> None:
    from experiments.run import main

    main(["fig2_kv_usage", "--size", "tiny", "--out", str(tmp_path)])
    res = pd.read_csv(tmp_path / "results.csv")
    assert list(res["system"]) == ["orca-max", "orca-pow2", "orca-oracle", "paged"]
    # the ordering the vLLM paper reports: max < pow2 < oracle < paged token-state share
    assert res["token_states_pct"].is_monotonic_increasing
    assert res.loc[res["system"] == "paged", "token_states_pct"].item() > 90
    readme = (tmp_path / "README.md").read_text()
    assert "python -m experiments.run" in readme and "commit" in readme
    assert (tmp_path / "kv_breakdown.png").is_file() and (tmp_path / "batched_requests.png").is_file()
