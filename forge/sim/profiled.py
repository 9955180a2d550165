"""A cost model fitted to measured step times (``ProfiledCostModel``; ``python -m forge.calibrate``
writes the profile it reads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forge.core.outputs import SchedulerOutput
from forge.sim.cost_model import BatchShape, CostModel, FastCostModel

PROFILE_FEATURES = (
    "num_seqs",
    "num_tokens",
    "num_prefill_seqs",
    "decode_context_tokens",
    "prefill_attn_pairs",
    "num_sampled",
)


def batch_features(batch: BatchShape) -> dict[str, float]:
    """The per-step regressors of ``ProfiledCostModel`` (a query of one token counts as a decode)."""
    prefill_seqs = 0
    decode_ctx = 0
    pairs = 0.0
    for q, s in zip(batch.query_lens, batch.seq_lens, strict=True):
        if q == 1:
            decode_ctx += s
        else:
            prefill_seqs += 1
            pairs += q * (s - (q - 1) / 2)
    return {
        "num_seqs": len(batch.query_lens),
        "num_tokens": sum(batch.query_lens),
        "num_prefill_seqs": prefill_seqs,
        "decode_context_tokens": decode_ctx,
        "prefill_attn_pairs": pairs,
        "num_sampled": batch.num_sampled,
    }


def _nnls(a: Any, b: Any) -> Any:
    """Least squares with non-negative coefficients (drop the most negative, refit)."""
    import numpy as np

    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        del active[int(np.argmin(sol))]
    return coef


class ProfiledCostModel(CostModel, FastCostModel):
    """A linear model of measured step times: ``t = intercept + sum_k coef_k * feature_k`` over
    ``PROFILE_FEATURES``, fitted by non-negative least squares on relative error (steps more than
    3 MADs off, i.e. disturbed by the OS, dropped and the fit repeated) on a profile CSV written by
    ``python -m forge.calibrate`` (one row per measured step: the feature columns + ``step_time_s``;
    other columns are ignored). Coefficients are kept >= 0 so the model never predicts a step
    getting cheaper as the batch grows."""

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(self, coefficients: dict[str, float], intercept: float) -> None:
        unknown = set(coefficients) - set(PROFILE_FEATURES)
        if unknown:
            raise ValueError(f"unknown profile features {sorted(unknown)}; known: {PROFILE_FEATURES}")
        self.coefficients = {k: float(coefficients.get(k, 0.0)) for k in PROFILE_FEATURES}
        self.intercept = float(intercept)

    @classmethod
    def fit(cls, rows: Sequence[Mapping[str, float]], times: Sequence[float]) -> ProfiledCostModel:
        import numpy as np

        if len(rows) < len(PROFILE_FEATURES) + 1:
            raise ValueError(f"a profile needs at least {len(PROFILE_FEATURES) + 1} measured steps, got {len(rows)}")
        x = np.array([[float(r[k]) for k in PROFILE_FEATURES] for r in rows])
        y = np.asarray(times, dtype=float)
        scale = np.maximum(np.abs(x).max(axis=0), 1e-12)
        xs = np.hstack([np.ones((len(rows), 1)), x / scale])
        weight = 1.0 / np.maximum(y, 1e-9)  # least squares on relative error
        keep = np.ones(len(y), dtype=bool)
        coef = np.zeros(xs.shape[1])
        for _ in range(3):  # refit without steps the OS clearly disturbed (> 3 MADs of relative error)
            coef = _nnls(xs[keep] * weight[keep, None], y[keep] * weight[keep])
            rel = (xs @ coef - y) * weight
            mad = float(np.median(np.abs(rel - np.median(rel)))) or 1e-12
            keep = np.abs(rel - np.median(rel)) <= 3 * 1.4826 * mad
        named = {k: float(coef[i + 1] / scale[i]) for i, k in enumerate(PROFILE_FEATURES)}
        return cls(named, float(coef[0]))

    @classmethod
    def from_csv(cls, path: str | Path) -> ProfiledCostModel:
        import pandas as pd

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"clock.profile: {str(path)!r} not found (write one with python -m forge.calibrate)"
            )
        df = pd.read_csv(path)
        missing = [c for c in (*PROFILE_FEATURES, "step_time_s") if c not in df.columns]
        if missing:
            raise ValueError(f"clock.profile {path}: missing columns {missing}")
        feats = df[list(PROFILE_FEATURES)].itertuples(index=False)
        rows = [dict(zip(PROFILE_FEATURES, map(float, row), strict=True)) for row in feats]
        return cls.fit(rows, df["step_time_s"].tolist())

    def predict(self, features: Mapping[str, float]) -> float:
        return self.intercept + sum(c * float(features[k]) for k, c in self.coefficients.items())

    def step_time(self, batch: BatchShape) -> float:
        if not batch.query_lens:
            return 0.0
        return self.predict(batch_features(batch))

    def step_time_of(self, sched: SchedulerOutput) -> float:
        return self.step_time(BatchShape.of(sched))

    def decode_step_time(self, num_decodes: int, context_sum: int) -> float | None:
        n = num_decodes
        return self.predict(
            {
                "num_seqs": n,
                "num_tokens": n,
                "num_prefill_seqs": 0,
                "decode_context_tokens": context_sum,
                "prefill_attn_pairs": 0.0,
                "num_sampled": n,
            }
        )
