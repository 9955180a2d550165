"""Length distributions and the new workloads (ShareGPT/Alpaca-like, shared prefix, trace replay)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from forge.config import compose_config
from forge.tokenizers.base import ByteTokenizer
from forge.workloads.shared_prefix import SharedPrefixWorkload
from forge.workloads.synthetic import LogNormal, clipped_lognormal_mean
from forge.workloads.trace import TraceWorkload


@pytest.mark.parametrize(("workload", "mean_in", "mean_out"), [("sharegpt", 161.31, 337.99), ("alpaca", 19.31, 58.45)])
def test_preset_sample_means_match_published(workload: str, mean_in: float, mean_out: float) -> None:
    from hydra.utils import instantiate

    cfg = compose_config([f"workload={workload}", "workload.num_requests=20000"])
    wl = instantiate(cfg.workload)
    rng = random.Random(1)
    ins = [wl.input_len.sample(rng) for _ in range(20000)]
    outs = [wl.output_len.sample(rng) for _ in range(20000)]
    assert sum(ins) / len(ins) == pytest.approx(mean_in, rel=0.03)
    assert sum(outs) / len(outs) == pytest.approx(mean_out, rel=0.03)
    assert min(ins) >= 4 and max(outs) <= 1024


def test_clipped_mean_formula_matches_monte_carlo() -> None:
    d = LogNormal(mean=100.0, sigma=1.5, low=4, high=300)
    assert clipped_lognormal_mean(d.mu, 1.5, 4, 300) == pytest.approx(100.0, rel=1e-6)
    rng = random.Random(0)
    xs = [d.sample(rng) for _ in range(50000)]
    assert sum(xs) / len(xs) == pytest.approx(100.0, rel=0.03)


def test_lognormal_rejects_impossible_mean() -> None:
    with pytest.raises(ValueError, match="mean"):
        LogNormal(mean=2000, low=4, high=1024)


def test_workloads_are_seeded() -> None:
    from hydra.utils import instantiate

    tok = ByteTokenizer()
    a = instantiate(compose_config(["workload=sharegpt", "workload.num_requests=50"]).workload).requests(tok)
    b = instantiate(compose_config(["workload=sharegpt", "workload.num_requests=50"]).workload).requests(tok)
    c = instantiate(compose_config(["workload=sharegpt", "workload.num_requests=50", "seed=1"]).workload).requests(tok)
    assert a == b
    assert a != c


def test_shared_prefix_prompts_share_their_prefixes() -> None:
    from hydra.utils import instantiate

    cfg = compose_config(["workload=shared_prefix", "workload.num_requests=40", "workload.prefix_len=64"])
    wl = instantiate(cfg.workload)
    assert isinstance(wl, SharedPrefixWorkload)
    specs = wl.requests(ByteTokenizer())
    prefixes = {tuple(s.prompt_token_ids[:64]) for s in specs}
    assert len(prefixes) == 4  # every prefix drawn at least once among 40 uniform draws (seeded)
    assert all(16 <= len(s.prompt_token_ids) - 64 <= 128 for s in specs)
    assert [s.arrival_time for s in specs] == sorted(s.arrival_time for s in specs)


def test_trace_replay_csv_and_jsonl(tmp_path) -> None:
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("arrival_time,input_len,output_len,prompt\n0.5,10,3,\n0.1,,7,hello world\n")
    jsonl_path = tmp_path / "t.jsonl"
    jsonl_path.write_text(
        json.dumps({"arrival_time": 0.5, "input_len": 10, "output_len": 3})
        + "\n"
        + json.dumps({"arrival_time": 0.1, "output_len": 7, "prompt": "hello world", "priority": 2})
        + "\n"
    )
    tok = ByteTokenizer()
    for path in (csv_path, jsonl_path):
        specs = TraceWorkload(str(path), time_scale=2.0, unsorted="sort").requests(tok)
        assert [s.arrival_time for s in specs] == [0.2, 1.0]
        assert specs[0].prompt_token_ids == tok.encode("hello world")
        assert specs[0].output_len == 7
        assert len(specs[1].prompt_token_ids) == 10 and specs[1].output_len == 3


def test_trace_errors_name_the_row(tmp_path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_time,output_len\n0.0,5\n")
    with pytest.raises(ValueError, match="line 2"):
        TraceWorkload(str(bad)).requests(ByteTokenizer())
    with pytest.raises(FileNotFoundError):
        TraceWorkload(str(tmp_path / "missing.csv")).requests(ByteTokenizer())


def test_trace_workload_runs_end_to_end(tmp_path) -> None:
    from forge.engine.build import build_engine, workload_requests

    path = tmp_path / "t.csv"
    path.write_text("arrival_time,input_len,output_len\n0.0,12,4\n0.01,30,5\n0.02,7,6\n")
    cfg = compose_config(["model=synthetic", "clock=simulated", "workload=trace", f"workload.path={path}"])
    engine = build_engine(cfg)
    finals = engine.run(workload_requests(cfg, engine))
    assert sorted(len(o.token_ids) for o in finals.values()) == [4, 5, 6]


@pytest.mark.parametrize(
    "override",
    [
        "workload.arrivals.rate=nan",
        "workload.arrivals.rate=inf",
        "workload.arrivals.rate=-1",
    ],
)
def test_a_rate_that_is_no_finite_positive_number_is_a_config_error(override: str) -> None:
    from forge.config import ConfigError
    from forge.engine.build import build_engine, workload_requests

    cfg = compose_config(["workload=poisson", "model=synthetic", "clock=simulated", override])
    with pytest.raises(ConfigError, match="workload.arrivals.rate must be a finite number > 0"):
        workload_requests(cfg, build_engine(cfg))


def test_nan_burstiness_and_sigma_are_refused() -> None:
    from forge.workloads.synthetic import Gamma
    from forge.workloads.vidur_arrivals import VidurPoisson

    for bad in (lambda: Gamma(1.0, float("nan")), lambda: Gamma(float("nan")), lambda: VidurPoisson(float("nan"))):
        with pytest.raises(ValueError, match="finite"):
            bad()
    with pytest.raises(ValueError, match="sigma"):
        LogNormal(mean=100.0, sigma=float("nan"))


@pytest.mark.parametrize(
    "overrides",
    [
        ["workload=poisson", "workload.input_len.high=99999999999"],
        ["workload=shared_prefix", "workload.prefix_len=4000"],
    ],
)
def test_a_prompt_longer_than_the_engine_takes_is_refused_before_it_is_drawn(overrides: list[str]) -> None:
    """A prompt the engine can never run (longer than max_model_len - 1) is a config error naming the
    request, raised before its tokens are drawn (a huge length would otherwise take the memory)."""
    from forge.config import ConfigError
    from forge.engine.build import build_engine, workload_requests

    cfg = compose_config([*overrides, "model=synthetic", "clock=simulated", "engine.max_model_len=2048"])
    with pytest.raises(ConfigError, match="longer than the 2047 the engine takes"):
        workload_requests(cfg, build_engine(cfg))


def test_a_trace_row_longer_than_the_engine_takes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"arrival_time": 0.0, "output_len": 4, "input_len": 10**12}) + "\n")
    with pytest.raises(ValueError, match="line 1 .*longer than the 100"):
        TraceWorkload(str(path)).requests(ByteTokenizer(), max_prompt_len=100)


def test_stop_strings_in_a_workload_run_are_refused_not_ignored() -> None:
    from forge.config import ConfigError
    from forge.engine.build import build_engine, workload_requests

    cfg = compose_config(["model=synthetic", "clock=simulated", "+sampling.stop=[xx]"])
    with pytest.raises(ConfigError, match="sampling.stop: stop strings are matched on decoded text"):
        workload_requests(cfg, build_engine(cfg))


def test_sampling_max_tokens_in_a_workload_run_is_refused_not_ignored() -> None:
    """The workload's output lengths are each request's max_tokens: ``+sampling.max_tokens=5`` ran every
    request to its drawn length (up to 64) as if it were not there."""
    from forge.config import ConfigError
    from forge.engine.build import build_engine, workload_requests

    cfg = compose_config(["model=synthetic", "clock=simulated", "+sampling.max_tokens=5"])
    with pytest.raises(ConfigError, match=r"sampling.max_tokens: .*workload.output_len"):
        workload_requests(cfg, build_engine(cfg))
