"""A study regenerates its report end to end (tiny size, into a temporary directory); the studies that
compare options run every configuration with each of ``experiments.seeds.SEEDS`` (at least 3) and report
the mean ± 95% CI over them."""

from __future__ import annotations

import pandas as pd
import pytest


def test_fig2_study_tiny(tmp_path) -> None:
    from experiments.run import main

    main(["fig2_kv_usage", "--size", "tiny", "--out", str(tmp_path)])
    from experiments.seeds import SEEDS

    res = pd.read_csv(tmp_path / "results.csv")
    assert list(res["system"]) == ["orca-max", "orca-pow2", "orca-oracle", "paged"]
    assert len(SEEDS) >= 3 and (res["n_seeds"] == len(SEEDS)).all()
    per_seed = pd.read_csv(tmp_path / "results_per_seed.csv")
    paged = per_seed[per_seed["system"] == "paged"]
    assert sorted(paged["seed"]) == sorted(SEEDS)
    assert res.loc[res["system"] == "paged", "token_states_pct"].item() == pytest.approx(
        paged["token_states_pct"].mean()
    )
    # the ordering the vLLM paper reports: max < pow2 < oracle < paged token-state share
    assert res["token_states_pct"].is_monotonic_increasing
    assert res.loc[res["system"] == "paged", "token_states_pct"].item() > 90
    readme = (tmp_path / "README.md").read_text()
    assert "python -m experiments.run" in readme and "commit" in readme
    assert (tmp_path / "kv_breakdown.png").is_file() and (tmp_path / "batched_requests.png").is_file()


def test_kv_memory_study_tiny(tmp_path) -> None:
    from experiments.run import main

    main(["kv_memory", "--size", "tiny", "--out", str(tmp_path)])
    from experiments.seeds import SEEDS

    # every fixed-budget configuration ran once per seed, with the workload drawn from that seed
    per_seed = pd.read_csv(tmp_path / "results_per_seed.csv")
    seeds = per_seed.groupby(["setup", "kv_cache_dtype"])["seed"].apply(sorted)
    assert len(seeds) == 6 and all(s == sorted(SEEDS) for s in seeds)  # (sim, real) x 3 dtypes
    sim_auto = per_seed[per_seed["setup"].str.startswith("sim") & (per_seed["kv_cache_dtype"] == "auto")]
    assert sim_auto["duration_s"].nunique() == len(SEEDS)  # each seed's workload differs
    res = pd.read_csv(tmp_path / "results.csv")
    assert len(SEEDS) >= 3 and (res["n_seeds"] == len(SEEDS)).all()
    sim_row = res[res["setup"].str.startswith("sim") & (res["kv_cache_dtype"] == "auto")].iloc[0]
    assert sim_row["duration_s"] == pytest.approx(sim_auto["duration_s"].mean()) and sim_row["duration_s_ci95"] > 0
    rows = res.to_dict("records")
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
    assert " ± " in readme and "95% confidence interval" in readme
    # the simulated fp8 row is marked, where the table shows it, as int8's by construction
    assert "| sim llama-3-8b h100 | fp8 (= int8 by construction: same bytes per value) |" in readme
    assert "identical in every seed, as checked in this run" in readme


def test_policies_load_study_tiny_reports_seeds_and_cis(tmp_path) -> None:
    from experiments.run import main
    from experiments.seeds import SEEDS

    main(["policies_load", "--size", "tiny", "--out", str(tmp_path)])
    per_seed = pd.read_csv(tmp_path / "results_per_seed.csv")
    assert len(SEEDS) >= 3
    # every configuration ran once per seed, and the table averages those runs with a 95% CI
    seeds = per_seed.groupby(["scheduler", "arrivals", "rate"])["seed"].apply(sorted)
    assert len(seeds) == 8 and all(s == sorted(SEEDS) for s in seeds)  # 4 policies x 2 arrival processes x 1 rate
    res = pd.read_csv(tmp_path / "results.csv")
    assert (res["n_seeds"] == len(SEEDS)).all()
    fcfs = per_seed[(per_seed["scheduler"] == "fcfs") & (per_seed["arrivals"] == "poisson")]["p50_ttft_ms"]
    row = res[(res["scheduler"] == "fcfs") & (res["arrivals"] == "poisson")].iloc[0]
    assert row["p50_ttft_ms"] == pytest.approx(fcfs.mean())
    assert row["p50_ttft_ms_ci95"] > 0
    readme = (tmp_path / "README.md").read_text()
    assert " ± " in readme and "95% confidence interval" in readme
    # the policies left out are checked, in the run, to schedule exactly as fcfs
    assert "decode_first, lpm, sarathi scheduled every request exactly as fcfs did" in readme


def test_chunked_prefill_study_tiny_reports_seeds_and_cis(tmp_path) -> None:
    from experiments.run import main
    from experiments.seeds import SEEDS

    main(["chunked_prefill", "--size", "tiny", "--out", str(tmp_path)])
    res = pd.read_csv(tmp_path / "results.csv")
    assert set(res["scheduler"]) == {"sarathi", "prefill_first"} and (res["n_seeds"] == len(SEEDS)).all()
    assert len(pd.read_csv(tmp_path / "results_per_seed.csv")) == len(res) * len(SEEDS)
    readme = (tmp_path / "README.md").read_text()
    assert "fcfs, decode_first scheduled every request exactly as sarathi did" in readme and " ± " in readme


def test_kv_sharing_study_tiny_reports_seeds_and_cis(tmp_path) -> None:
    from experiments.run import main
    from experiments.seeds import SEEDS

    main(["kv_sharing", "--size", "tiny", "--out", str(tmp_path)])
    per_seed = pd.read_csv(tmp_path / "results_per_seed.csv")
    seeds = per_seed.groupby(["mode", "k"])["seed"].apply(sorted)
    assert len(seeds) == 8 and all(s == sorted(SEEDS) for s in seeds)  # 2 modes x 3 widths + fork vs separate
    res = pd.read_csv(tmp_path / "results.csv")
    assert (res["n_seeds"] == len(SEEDS)).all()
    beam = res[(res["mode"] == "beam") & (res["k"] == 4)].iloc[0]
    assert beam["saved_pct"] == pytest.approx(
        per_seed[(per_seed["mode"] == "beam") & (per_seed["k"] == 4)]["saved_pct"].mean()
    )
    assert beam["paper_pct"] == 53.13 and beam["saved_pct"] > 0
    fork = res[res["mode"] == "parallel (n=4 vs)"].iloc[0]
    separate = res[res["mode"] == "separate requests"].iloc[0]
    assert fork["prefill_tokens"] < separate["prefill_tokens"]  # the fork computes each prompt once
    readme = (tmp_path / "README.md").read_text()
    assert " ± " in readme and "95% confidence interval" in readme


def test_routing_study_tiny_reports_every_router_over_seeds(tmp_path) -> None:
    from experiments.run import main
    from experiments.seeds import SEEDS

    main(["routing", "--size", "tiny", "--out", str(tmp_path)])
    res = pd.read_csv(tmp_path / "results.csv")
    assert set(res["router"]) == {"round_robin", "least_outstanding", "power_of_two", "prefix_aware"}
    assert set(res["workload"]) == {"shared_prefix", "azure_conv"} and (res["n_seeds"] == len(SEEDS)).all()
    per_seed = pd.read_csv(tmp_path / "results_per_seed.csv")
    assert len(per_seed) == len(res) * len(SEEDS) and (per_seed["replicas"] == 4).all()
    aware = res[(res["workload"] == "shared_prefix") & (res["router"] == "prefix_aware")].iloc[0]
    rr = res[(res["workload"] == "shared_prefix") & (res["router"] == "round_robin")].iloc[0]
    assert aware["hit_rate"] > rr["hit_rate"]  # the cache-aware router finds the prefixes it sent
    assert " ± " in (tmp_path / "README.md").read_text() and (tmp_path / "routing.png").stat().st_size > 0


def test_disaggregation_study_tiny_compares_layouts_by_goodput_per_gpu(tmp_path) -> None:
    from experiments.run import main

    main(["disaggregation", "--size", "tiny", "--out", str(tmp_path)])
    res = pd.read_csv(tmp_path / "results.csv")
    assert set(res["layout"]) == {"4 co-located", "2P+2D"} and (res["goodput_per_gpu"] > 0).all()
    per_window = pd.read_csv(tmp_path / "results_per_window.csv")
    assert (per_window["gpus"] == 4).all() and (per_window["missed_at"] > per_window["rate"]).all()
    assert "most goodput per GPU" in (tmp_path / "README.md").read_text()


def test_gpu_capacity_study_tiny_checks_its_replica_count(tmp_path) -> None:
    from experiments.run import main

    main(["gpu_capacity", "--size", "tiny", "--out", str(tmp_path)])
    per_window = pd.read_csv(tmp_path / "results_per_window.csv")
    assert (per_window["attainment_at_n"] >= 0.9).all()  # the replica count found meets the SLO when run
    ok_below = per_window["attainment_at_n_minus_1"].isna() | (per_window["attainment_at_n_minus_1"] < 0.9)
    assert ok_below.all() and (per_window["gpus_needed"] == per_window["replicas"] * per_window["tp"]).all()


def test_route_real_study_tiny_sets_measured_beside_simulated(tmp_path) -> None:
    from experiments.run import main

    main(["route_real", "--size", "tiny", "--out", str(tmp_path)])
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert sorted(zip(runs["router"], runs["side"], strict=True)) == [
        ("prefix_aware", "measured"),
        ("prefix_aware", "simulated"),
        ("round_robin", "measured"),
        ("round_robin", "simulated"),
    ]
    assert (runs["completed"] == 16).all() and (runs["failed"] == 0).all()
    # the gateway and the simulator ran the router named (its class, as each side reports it)
    assert set(runs.loc[runs["router"] == "prefix_aware", "router_class"]) == {"PrefixAware"}
    assert set(runs.loc[runs["router"] == "round_robin", "router_class"]) == {"RoundRobin"}
    assert (runs.loc[runs["router"] == "round_robin", "requests_per_replica"] == "8/8").all()
    res = pd.read_csv(tmp_path / "results.csv")
    assert len(res) == 2 * 6 and (res["measured"] > 0).all() and (res["simulated"] > 0).all()
    assert list(res["measured/simulated"]) == pytest.approx(list(res["measured"] / res["simulated"]))
    readme = (tmp_path / "README.md").read_text()
    assert "load average" in readme and "commit" in readme and "| round_robin | p90 TTFT (ms) |" in readme
    assert (tmp_path / "cpu-tiny.csv").is_file()  # the profile calibrated in this run
