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


def test_kv_memory_study_tiny(tmp_path) -> None:
    from experiments.run import main

    main(["kv_memory", "--size", "tiny", "--out", str(tmp_path)])
    rows = pd.read_csv(tmp_path / "results.csv").to_dict("records")
    tokens = {(str(r["setup"]).split()[0], str(r["kv_cache_dtype"])): int(r["pool_tokens"]) for r in rows}
    # the same 2 GiB hold about twice the tokens in one byte per value (less the scales' share)
    assert 1.8 < tokens["sim", "int8"] / tokens["sim", "auto"] < 2.0
    assert tokens["real", "int8"] > 2 * tokens["real", "auto"]
    acc = pd.read_csv(tmp_path / "accuracy.csv")
    dlogprob = dict(zip(acc["kv_cache_dtype"], acc["text_mean_abs_dlogprob"], strict=True))
    assert set(dlogprob) == {"float32", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2"}
    assert (acc["text_perplexity"] > 1).all()
    # the fixed text's logprobs move with the cache's precision: 8 significant bits (bf16) < 3 (fp8_e5m2)
    assert 0 < dlogprob["bfloat16"] < dlogprob["fp8_e5m2"]
    assert pd.read_csv(tmp_path / "window.csv")["same_tokens_as_off"].all()
    readme = (tmp_path / "README.md").read_text()
    assert "python -m experiments.run" in readme and "commit" in readme and "load average" in readme
