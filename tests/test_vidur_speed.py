"""benchmarks/vidur_speed.py: the same trace for both simulators, and the same-run report (issue 35).
The timed runs need Vidur (benchmarks/vidur_setup.sh); without it the benchmark refuses in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import vidur_speed
from forge.config import compose_config


def test_both_simulators_get_issue_16s_trace() -> None:
    cmd = vidur_speed.vidur_command("py", "/tmp/out")
    flags = dict(f.removeprefix("--").split("=", 1) for f in cmd[3:] if "=" in f)
    assert cmd[:3] == ["py", "-m", "vidur.main"]
    assert flags["synthetic_request_generator_config_num_requests"] == "10000"
    assert flags["poisson_request_interval_generator_config_qps"] == "10.0"
    assert (flags["fixed_request_length_generator_config_prefill_tokens"], flags["seed"]) == ("512", "42")
    cfg = compose_config(vidur_speed.FORGE_ARGS)
    assert cfg.workload.num_requests == 10000 and cfg.workload.arrivals.rate == 10.0
    assert cfg.workload.arrivals.seed == 42 and cfg.workload.input_len.value == 512
    assert cfg.workload.output_len.value == 128 and cfg.report is False


def test_the_report_gives_each_rounds_cpu_load_and_ratio() -> None:
    rounds = [
        {"vidur": {"cpu_s": 30.0, "load_before": 1.5}, "forge": {"cpu_s": 3.0, "load_before": 1.25}},
        {"vidur": {"cpu_s": 40.0, "load_before": 2.0}, "forge": {"cpu_s": 5.0, "load_before": 2.5}},
    ]
    text = vidur_speed.report(rounds, ["--rounds", "2"], "7d47513")
    assert "| 1 | 30.0 | 1.50 | 3.00 | 1.25 | 10.0x |" in text
    assert "| 2 | 40.0 | 2.00 | 5.00 | 2.50 | 8.0x |" in text
    assert "Median: Vidur 35.0 CPU-s, forge 4.00 CPU-s; per round forge is 8.0-10.0x faster" in text


def test_without_vidur_it_refuses_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no Vidur laid out at"):
        vidur_speed.main(["--vidur-src", str(tmp_path)])


def test_vidur_runs_with_the_model_cache_of_the_installed_attention_profile(tmp_path: Path) -> None:
    assert vidur_speed.cache_dir_of(tmp_path) == "cache"  # a checkout laid out before profiles were labelled
    (tmp_path / "ATTENTION_PROFILE").write_text("label=computed\nsha256=c8d8e33c366cbb10011267527ad8\norigin=x\n")
    cache = vidur_speed.cache_dir_of(tmp_path)
    assert cache == "cache/computed-c8d8e33c366c"
    assert f"--metrics_config_cache_dir={cache}" in vidur_speed.vidur_command("py", "/tmp/out", cache)
