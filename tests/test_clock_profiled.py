"""The profiled cost model: fit, CSV round trip, clock=profiled, and the calibration script."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from forge.config import compose_config
from forge.sim.cost_model import BatchShape
from forge.sim.profiled import PROFILE_FEATURES, ProfiledCostModel, batch_features


def synthetic_profile(n: int, noise: float, seed: int = 0) -> tuple[list[dict[str, float]], list[float]]:
    true = {"num_seqs": 2e-5, "num_tokens": 1e-5, "decode_context_tokens": 1e-7, "prefill_attn_pairs": 1e-9}
    rng = random.Random(seed)
    rows, times = [], []
    for _ in range(n):
        q = [rng.choice([1, 1, 1, rng.randint(2, 300)]) for _ in range(rng.randint(1, 32))]
        s = [qq + rng.randint(0, 1000) for qq in q]
        f = batch_features(BatchShape(q, s, len(q)))
        rows.append(f)
        times.append((1e-3 + sum(true.get(k, 0) * f[k] for k in f)) * (1 + rng.gauss(0, noise)))
    return rows, times


def test_fit_recovers_a_linear_cost() -> None:
    rows, times = synthetic_profile(400, noise=0.0)
    model = ProfiledCostModel.fit(rows, times)
    assert model.intercept == pytest.approx(1e-3, rel=1e-3)
    assert model.coefficients["num_tokens"] == pytest.approx(1e-5, rel=1e-3)
    assert all(c >= 0 for c in model.coefficients.values())


def test_fit_predicts_held_out_steps_and_ignores_outliers() -> None:
    rows, times = synthetic_profile(600, noise=0.05)
    times[::50] = [t * 30 for t in times[::50]]  # OS hiccups
    model = ProfiledCostModel.fit(rows[:400], times[:400])
    test_rows, test_times = synthetic_profile(200, noise=0.0, seed=1)
    errors = [abs(model.predict(r) / t - 1) for r, t in zip(test_rows, test_times, strict=True)]
    assert sum(errors) / len(errors) < 0.05


def test_profiled_clock_from_csv(tmp_path) -> None:
    from forge.engine.build import build_engine, workload_requests

    rows, times = synthetic_profile(200, noise=0.0)
    path = tmp_path / "p.csv"
    pd.DataFrame([{**r, "step_time_s": t} for r, t in zip(rows, times, strict=True)]).to_csv(path, index=False)
    cfg = compose_config(["clock=profiled", f"clock.profile={path}", "workload=fixed", "workload.num_requests=4"])
    engine = build_engine(cfg)
    assert engine.clock.simulated
    engine.run(workload_requests(cfg, engine))
    steps = engine.recorder.steps_frame()
    assert (steps["end_time"] - steps["start_time"] >= 1e-3).all()  # the fitted intercept at least


def test_profile_missing_columns_is_reported(tmp_path) -> None:
    path = tmp_path / "p.csv"
    pd.DataFrame({"num_seqs": [1], "step_time_s": [0.1]}).to_csv(path, index=False)
    with pytest.raises(ValueError, match="missing columns"):
        ProfiledCostModel.from_csv(path)


@pytest.mark.slow
def test_calibrate_quick_writes_a_usable_profile(tmp_path) -> None:
    from forge.calibrate import main

    out = tmp_path / "cpu.csv"
    main(["--quick", "--no-validate", "--out", str(out), "backend.num_threads=1"])
    df = pd.read_csv(out)
    assert set(PROFILE_FEATURES) | {"run", "step", "step_time_s"} <= set(df.columns)
    assert (df["step_time_s"] > 0).all() and df["run"].nunique() == 5
    model = ProfiledCostModel.from_csv(out)
    assert model.step_time(BatchShape([1] * 8, [100] * 8, 8)) > 0
