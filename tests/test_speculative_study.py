"""The speculative-decoding study (``python -m experiments.run speculative``) runs every case (workload x
drafter x batch) once per seed of ``experiments.seeds.SEEDS``, the seed changes the synthetic model's tokens
and the workload's prompts, every seed's outputs are checked against no speculation, and the report gives
speedup, tokens per target forward and acceptance as mean ± 95% CI."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.speculative.study import run_case
from experiments.speculative.workloads import FUNCTIONS, QUESTIONS, chat_messages, drawn_functions, grounded_prompts


def test_each_seed_draws_its_own_prompts_from_the_whole_list() -> None:
    assert grounded_prompts(4, 1) != grounded_prompts(4, 2) and chat_messages(4, 1) != chat_messages(4, 3)
    assert grounded_prompts(4, 2) == grounded_prompts(4, 2)  # a seed's prompts are reproducible
    assert {f.__name__ for f in drawn_functions(len(FUNCTIONS), 5)} == {f.__name__ for f in FUNCTIONS}


def test_the_seed_changes_the_synthetic_models_tokens() -> None:
    n = len(QUESTIONS)
    a, b = (run_case("synthetic", "chat", "none", "simulated", n, 8, None, n, seed=s)["outputs"] for s in (1, 2))
    assert sorted(map(tuple, a)) != sorted(map(tuple, b))  # the same questions, so only the model can differ


def test_speculative_study_tiny_runs_every_case_over_the_seeds(tmp_path) -> None:
    from experiments.run import main
    from experiments.seeds import SEEDS

    main(["speculative", "--size", "tiny", "--out", str(tmp_path)])
    per_seed = pd.read_csv(tmp_path / "synthetic_simulated_per_seed.csv", comment="#")
    seeds = per_seed.groupby(["workload", "drafter", "batch"])["seed"].apply(sorted)
    assert len(SEEDS) >= 3 and len(seeds) == 8 and all(s == sorted(SEEDS) for s in seeds)  # 2 x 2 x 2 batches
    assert per_seed["identical_to_no_spec"].all()  # checked in every seed against that seed's no-drafter run
    by_case = per_seed.groupby(["workload", "drafter", "batch"])
    # the seed changes the model's tokens (chat prompts all end in the same template tokens) ...
    assert (by_case["acceptance_rate"].nunique().xs("ngram", level="drafter") == len(SEEDS)).all()
    # ... and the prompts, whose prefill the simulated clock charges by length
    assert (by_case["prefill_step_seconds"].nunique() == len(SEEDS)).all()
    res = pd.read_csv(tmp_path / "synthetic_simulated.csv")
    assert (res["n_seeds"] == len(SEEDS)).all() and list(res.columns[:4]) == [
        "workload",
        "drafter",
        "batch",
        "requests",
    ]
    row = res[(res["workload"] == "grounded") & (res["drafter"] == "ngram") & (res["batch"] == 1)].iloc[0]
    seeds_b1 = per_seed[
        (per_seed["workload"] == "grounded") & (per_seed["drafter"] == "ngram") & (per_seed["batch"] == 1)
    ]
    for metric in ("speedup", "tokens_per_target_forward", "acceptance_rate"):
        assert row[metric] == pytest.approx(seeds_b1[metric].mean()) and row[f"{metric}_ci95"] > 0
    readme = (tmp_path / "README.md").read_text()
    assert "95% confidence interval" in readme and "python -m experiments.run speculative --size tiny" in readme
    assert f"| grounded | ngram | 1 | 1 | {len(SEEDS)} |" in readme and f"| {len(SEEDS)}/{len(SEEDS)} |" in readme
    assert "x speedup" in readme and " ± " in readme and "load average" in readme
    assert (tmp_path / "sim_speedup.png").stat().st_size > 0
