"""``python -m experiments.calibration_readme`` writes ``reports/calibration/README.md``: a description of the
calibration files that ``python -m forge.calibrate`` left there, every number read from those files (it
measures nothing itself)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from experiments.common import REPO, provenance, table

CAL = REPO / "reports" / "calibration"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cal = Path(argv[0]) if argv else CAL
    rep = json.loads((cal / "cpu-tiny.json").read_text())
    prof = pd.read_csv(cal / "cpu-tiny.csv")
    train = pd.read_csv(cal / "cpu-tiny.train.csv")
    ho = prof.loc[prof["run"] == rep["fit"]["holdout_run"], "step_time_s"]
    fit, hw, e2e = rep["fit"], rep["hardware"], rep.get("end_to_end", {})
    runs = (
        prof.groupby("run", sort=False)
        .agg(
            steps=("step", "size"),
            mean_seqs=("num_seqs", "mean"),
            max_tokens=("num_tokens", "max"),
            prefill_step_share=("num_prefill_seqs", lambda s: float((s > 0).mean())),
            median_step_ms=("step_time_s", lambda s: 1e3 * float(s.median())),
            total_s=("step_time_s", "sum"),
        )
        .reset_index()
    )
    runs["role"] = ["held out" if r == fit["holdout_run"] else "fit" for r in runs["run"]]
    coef = pd.DataFrame(
        [{"term": "intercept (per step)", "seconds": fit["intercept"]}]
        + [{"term": f"per unit of {k}", "seconds": v} for k, v in fit["coefficients"].items()]
    )
    e2e_df = pd.DataFrame(
        [
            {"metric": k, "wall": v["wall"], "profiled": v["profiled"], "error": v["profiled"] / v["wall"] - 1}
            for k, v in e2e.items()
        ]
    )
    prov = provenance()
    cmd = "python -m forge.calibrate --out reports/calibration/cpu-tiny.csv " + " ".join(rep["overrides"])
    md = [
        "# Calibration: the profiled clock for the tiny model on this CPU",
        "",
        f"Files written by `{cmd}` (model `{rep['model']}`, machine {rep['machine']}; the log `calibrate.log` "
        "is that command's output). They were added in the repository's history before this README; the "
        "measurement is not re-run here. This README is generated from those files by "
        f"`python -m experiments.calibration_readme` (commit `{prov['commit']}`, {prov['date']}).",
        "",
        "## What each file is",
        "",
        f"- `cpu-tiny.csv`: the profile, one row per measured engine step ({len(prof)} steps over "
        f"{prof['run'].nunique()} runs, the first 3 steps of each run dropped as warm-up): batch composition "
        "features and the measured wall time of the step (schedule + model + sampling + scheduler update). "
        "Format: the docstring of "
        "`forge/calibrate.py`.",
        f"- `cpu-tiny.train.csv`: the same rows without the held-out run `{fit['holdout_run']}` ({len(train)} steps): "
        "the file to give `clock=profiled clock.profile=...`, so that the held-out check is honest.",
        "- `cpu-tiny.json`: the fit (non-negative least squares on relative error, outlier steps > 3 MADs dropped; "
        "`ProfiledCostModel.fit` in `forge/sim/profiled.py`), its held-out error, the end-to-end replay check and the "
        "machine's measured fp32 GEMM rate and copy bandwidth.",
        "- `calibrate.log`: the console output of the run.",
        "",
        "## Calibration runs",
        "",
        table(
            runs,
            list(runs.columns),
            {"mean_seqs": ".1f", "prefill_step_share": ".2f", "median_step_ms": ".3f", "total_s": ".3f"},
        ),
        "",
        "## Fitted step-time model",
        "",
        "step time = intercept + sum of coefficient x feature (features as in the CSV).",
        "",
        table(coef, ["term", "seconds"], {"seconds": ".3e"}),
        "",
        f"Held-out run `{fit['holdout_run']}` ({fit['holdout_steps']} steps): per-step mean absolute percentage error "
        f"{fit['step_mape']:.1%} (median {fit['step_median_ape']:.1%}, P90 {fit['step_p90_ape']:.1%}); summed step "
        f"time predicted {fit['holdout_total_predicted_s']:.3f} s vs measured {fit['holdout_total_measured_s']:.3f} s "
        f"({fit['holdout_total_error']:+.1%}).",
        "",
        "## End-to-end: the held-out workload under `clock=wall` vs `clock=profiled` (fitted on the other runs)",
        "",
        table(e2e_df, ["metric", "wall", "profiled", "error"], {"error": "+.1%"}),
        "",
        "## Measured hardware (the `cpu` preset of `forge/sim/cost_model.py` uses these)",
        "",
        f"- fp32 1024x1024 GEMM: {hw['fp32_matmul_flops'] / 1e9:.1f} GFLOP/s; copy bandwidth "
        f"{hw['copy_bandwidth_Bps'] / 1e9:.1f} GB/s; torch threads {hw['torch_threads']}.",
        "",
        "## Reading it",
        "",
        f"- The fit is usable for the median step ({fit['step_median_ape']:.1%} error) but not for the total: it "
        f"under-predicts the held-out run's summed step time by {-fit['holdout_total_error']:.0%}. That run's mean "
        f"step ({1e3 * ho.mean():.2f} ms) is {ho.mean() / ho.median():.1f}x its median ({1e3 * ho.median():.2f} ms) "
        f"and the P90 error is {fit['step_p90_ape']:.0%}: a tail of slow steps the linear model does not predict. "
        "Whether they are OS interference on the 2 shared cores (which the robust fit deliberately drops as "
        "outliers) or a cost the features miss, these files cannot tell.",
        "- End to end: "
        + ", ".join(f"{r.metric} {r.error:+.0%}" for r in e2e_df.itertuples())
        + ". Duration follows the arrivals at this light load, so it agrees whatever the step times; the "
        "decode-bound metrics (mean TPOT, mean end-to-end latency) inherit the under-predicted step tail.",
        "- Only the tiny model (float64, torch CPU) was calibrated; no GPU profile exists, so the GPU studies use "
        "the roofline `simulated` clock, not this profile.",
        "",
    ]
    (cal / "README.md").write_text("\n".join(md))
    print(f"wrote {cal / 'README.md'}")


if __name__ == "__main__":
    main()
