"""Measure the real engine step by step and write a profile CSV for ``clock=profiled``.

``python -m forge.calibrate [--model tiny] [--out profiles/cpu-tiny.csv] [override ...]`` runs a set of
workloads under the wall clock with the configured model and backend, records every step's batch
composition and measured time, fits ``ProfiledCostModel`` on all runs but the held-out one, and reports
how well it predicts the held-out run (per-step error and whole-run time) plus an end-to-end check:
the held-out workload replayed under ``clock=profiled`` against its wall-clock summary.

Profile CSV format (one row per measured engine step; what ``ProfiledCostModel.from_csv`` reads):

====================== ===============================================================
``run``                 name of the calibration run the step belongs to
``step``                step index within the run
``num_seqs``            requests scheduled this step
``num_tokens``          tokens computed this step (prompt chunks + decodes)
``num_prefill_seqs``    requests with more than one query token (prompt chunks)
``decode_context_tokens`` sum of context lengths of the one-token (decode) requests
``prefill_attn_pairs``  causal (query, key) pairs of the prompt chunks
``num_sampled``         rows sampled (one per request finishing its known tokens)
``step_time_s``         measured wall seconds from ``step_started`` to ``step_finished``
                        (schedule + model + sampling + scheduler update)
====================== ===============================================================
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forge.core.outputs import SchedulerOutput
from forge.sim.clock import WallClock
from forge.sim.cost_model import BatchShape
from forge.sim.profiled import PROFILE_FEATURES, ProfiledCostModel, batch_features


class RecordingClock(WallClock):
    """The wall clock, keeping each step's batch features and measured duration."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, float]] = []
        self._started = 0.0

    def step_started(self) -> None:
        self._started = time.perf_counter()

    def step_finished(self, sched: SchedulerOutput) -> None:
        elapsed = time.perf_counter() - self._started
        row = batch_features(BatchShape.of(sched))
        row["step_time_s"] = elapsed
        self.rows.append(row)


@dataclass(frozen=True)
class CalibrationRun:
    name: str
    overrides: tuple[str, ...]


def default_runs(quick: bool) -> list[CalibrationRun]:
    """Batch compositions from single-request decode to full mixed batches; the last is held out."""
    n = 12 if quick else 48
    runs = [
        CalibrationRun("batch-small", ("workload=fixed", f"workload.num_requests={n // 4}", "engine.max_num_seqs=4")),
        CalibrationRun(
            "poisson-light",
            (
                "workload=poisson",
                f"workload.num_requests={n // 2}",
                "workload.arrivals.rate=4",
                "engine.max_num_seqs=16",
            ),
        ),
        CalibrationRun(
            "burst-chunked",
            (
                "workload=poisson",
                f"workload.num_requests={n}",
                "workload.arrivals.rate=200",
                "engine.max_num_batched_tokens=128",
            ),
        ),
        CalibrationRun(
            "burst-wide",
            (
                "workload=poisson",
                f"workload.num_requests={n}",
                "workload.arrivals.rate=200",
                "engine.max_num_batched_tokens=1024",
            ),
        ),
        CalibrationRun(
            "holdout-gamma",
            (
                "workload=gamma",
                f"workload.num_requests={n}",
                "workload.arrivals.rate=20",
                "seed=7",
                "engine.max_num_batched_tokens=256",
            ),
        ),
    ]
    return runs


def run_with_clock(overrides: list[str]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Run one workload; return (per-step profile rows, run summary)."""
    from forge.config import compose_config
    from forge.engine.build import build_engine, workload_requests
    from forge.results.metrics import summarize

    cfg = compose_config(overrides)
    engine = build_engine(cfg)
    requests = workload_requests(cfg, engine)
    engine.run(requests)
    summary = summarize(engine.recorder.requests_frame(), engine.recorder.steps_frame(), {})
    rows = getattr(engine.clock, "rows", [])  # a RecordingClock (possibly this module run as __main__)
    return pd.DataFrame(rows), summary


def measure(model: str, runs: list[CalibrationRun], extra: list[str], warmup_steps: int = 3) -> pd.DataFrame:
    frames = []
    base = [f"model={model}", "clock=wall", "clock._target_=forge.calibrate.RecordingClock", "progress=false"]
    for run in runs:
        t0 = time.perf_counter()
        df, _ = run_with_clock([*base, *run.overrides, *extra])
        df = df.iloc[warmup_steps:].copy()
        df.insert(0, "step", range(len(df)))
        df.insert(0, "run", run.name)
        frames.append(df)
        print(f"  {run.name}: {len(df)} steps in {time.perf_counter() - t0:.1f} s")
    return pd.concat(frames, ignore_index=True)


def fit_report(profile: pd.DataFrame, holdout: str) -> dict[str, Any]:
    train, test = profile[profile["run"] != holdout], profile[profile["run"] == holdout]
    cols = list(PROFILE_FEATURES)
    rows = [dict(zip(PROFILE_FEATURES, map(float, r), strict=True)) for r in train[cols].to_numpy()]
    model = ProfiledCostModel.fit(rows, train["step_time_s"].tolist())
    pred = np.array([model.predict(dict(zip(PROFILE_FEATURES, r, strict=True))) for r in test[cols].to_numpy()])
    real = test["step_time_s"].to_numpy()
    ape = np.abs(pred - real) / real
    return {
        "coefficients": model.coefficients,
        "intercept": model.intercept,
        "holdout_run": holdout,
        "holdout_steps": len(test),
        "step_mape": float(ape.mean()),
        "step_median_ape": float(np.median(ape)),
        "step_p90_ape": float(np.percentile(ape, 90)),
        "holdout_total_measured_s": float(real.sum()),
        "holdout_total_predicted_s": float(pred.sum()),
        "holdout_total_error": float(pred.sum() / real.sum() - 1),
    }


def end_to_end(model: str, run: CalibrationRun, profile_path: Path, extra: list[str]) -> dict[str, Any]:
    """The held-out workload under the wall clock vs under ``clock=profiled`` fitted to the training runs."""
    _, wall = run_with_clock([f"model={model}", "clock=wall", "progress=false", *run.overrides, *extra])
    _, sim = run_with_clock(
        [f"model={model}", "clock=profiled", f"clock.profile={profile_path}", "progress=false", *run.overrides, *extra]
    )
    keys = ("duration_s", "mean_ttft_ms", "p90_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "mean_e2e_ms")
    return {k: {"wall": wall.get(k), "profiled": sim.get(k)} for k in keys}


def measure_hardware() -> dict[str, float]:
    """fp32 GEMM FLOP/s and copy bandwidth with torch on this machine (for the ``cpu`` preset)."""
    import torch

    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    reps = 10
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    flops = 2 * n**3 * reps / (time.perf_counter() - t)
    x = torch.empty(64 * 2**20 // 4)
    y = torch.empty_like(x)
    y.copy_(x)
    t = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    bw = 2 * x.numel() * 4 * reps / (time.perf_counter() - t)
    return {"fp32_matmul_flops": flops, "copy_bandwidth_Bps": bw, "torch_threads": torch.get_num_threads()}


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
    except (OSError, subprocess.CalledProcessError):
        name = platform.processor()
    import os

    return f"{name or platform.machine()}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m forge.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="model option (tiny, smollm2, ...)")
    ap.add_argument("--out", default="profiles/cpu-tiny.csv", help="profile CSV to write")
    ap.add_argument("--quick", action="store_true", help="small runs (a smoke test)")
    ap.add_argument("--no-validate", action="store_true", help="skip the end-to-end replay check")
    ap.add_argument("overrides", nargs="*", help="extra config overrides, e.g. backend.num_threads=1")
    args = ap.parse_args(argv)
    runs = default_runs(args.quick)
    print(f"calibrating model={args.model} on {machine()}")
    profile = measure(args.model, runs, args.overrides)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    train_path = out.with_name(out.stem + ".train.csv")
    holdout = runs[-1].name
    profile.to_csv(out, index=False)
    profile[profile["run"] != holdout].to_csv(train_path, index=False)
    report: dict[str, Any] = {"model": args.model, "machine": machine(), "overrides": args.overrides}
    report["fit"] = fit_report(profile, holdout)
    report["hardware"] = measure_hardware()
    if not args.no_validate:
        report["end_to_end"] = end_to_end(args.model, runs[-1], train_path, args.overrides)
    (out.with_suffix(".json")).write_text(json.dumps(report, indent=2))
    fit = report["fit"]
    print(f"wrote {out} ({len(profile)} steps) and {out.with_suffix('.json')}")
    print(
        f"held-out run {holdout}: per-step MAPE {fit['step_mape']:.1%} (median {fit['step_median_ape']:.1%}), "
        f"whole-run time error {fit['holdout_total_error']:+.1%}"
    )
    for k, v in report.get("end_to_end", {}).items():
        print(f"  {k:<14} wall {v['wall']:.4g}  profiled {v['profiled']:.4g}")


if __name__ == "__main__":
    main()
