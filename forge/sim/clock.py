"""Time for the engine: the wall clock, or a simulated clock charging each step what a cost
model predicts for its batch on a named piece of hardware."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from operator import mul
from pathlib import Path
from typing import Any

from forge.core.decode_run import DecodeRun
from forge.core.fast_paths import declares_fast_paths
from forge.core.outputs import SchedulerOutput
from forge.models.base import ModelDims
from forge.models.presets import model_dims


@dataclass(frozen=True)
class Hardware:
    """Peak dense bf16 FLOP/s, memory bandwidth (B/s), memory (bytes), fixed cost per step (s)."""

    name: str
    flops: float
    mem_bw: float
    memory: float
    step_overhead: float = 0.0
    flops_efficiency: float = 0.6
    bw_efficiency: float = 0.8


HARDWARE: dict[str, Hardware] = {
    "a100": Hardware("A100-SXM4-80GB", 312e12, 2.039e12, 80e9, step_overhead=3e-4),
    "a100-40gb": Hardware("A100-SXM4-40GB", 312e12, 1.555e12, 40e9, step_overhead=3e-4),
    "h100": Hardware("H100-SXM5-80GB", 989e12, 3.35e12, 80e9, step_overhead=3e-4),
    "h200": Hardware("H200-SXM-141GB", 989e12, 4.8e12, 141e9, step_overhead=3e-4),
    # This dev machine (AMD EPYC, 2 shared cores), 1 torch thread, fp32, as measured by
    # `python -m forge.calibrate --out reports/calibration/cpu-tiny.csv backend.num_threads=1`
    # (reports/calibration/cpu-tiny.json: GEMM 31.1 GFLOP/s, copy 16.8 GB/s; step overhead = fitted intercept).
    "cpu": Hardware(
        "AMD EPYC (2 cores, measured)",
        31.1e9,
        16.8e9,
        2.53e10,
        step_overhead=3.7e-4,
        flops_efficiency=1.0,
        bw_efficiency=1.0,
    ),
}


def hardware_preset(name: str) -> Hardware:
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"unknown clock.hardware {name!r}; known: {sorted(HARDWARE)}") from None


@dataclass(frozen=True)
class BatchShape:
    """What a cost model sees of one step: per request, new tokens and context after the step."""

    query_lens: list[int]
    seq_lens: list[int]
    num_sampled: int

    @classmethod
    def of(cls, sched: SchedulerOutput) -> BatchShape:
        chunks = sched.scheduled
        # Drafts are scheduled all or none, so only sampling chunks have any: one row each, plus the last token's.
        return cls(
            query_lens=[c.num_tokens for c in chunks],
            seq_lens=[c.start + c.num_tokens for c in chunks],
            num_sampled=[c.sample for c in chunks].count(True) + sum([c.num_draft_tokens for c in chunks]),
        )


class CostModel(ABC):
    """Predicted seconds for one engine step: ``step_time`` of the step's ``BatchShape``.

    Fast paths (``forge.core.fast_paths``): ``step_time_of(sched)`` (the step's time computed from the
    ``SchedulerOutput`` directly) and ``decode_step_time`` (a step of plain decodes from two sums, for
    decode runs) are called by a ``PredictedClock`` only when the cost model's own class sets
    ``fast_paths = True``, promising both equal ``step_time`` bit for bit. For any other class (a
    subclass inherits no declaration) the clock calls ``step_time(BatchShape.of(sched))`` every step."""

    @abstractmethod
    def step_time(self, batch: BatchShape) -> float: ...

    def step_time_of(self, sched: SchedulerOutput) -> float:
        return self.step_time(BatchShape.of(sched))

    def decode_step_time(self, num_decodes: int, context_sum: int) -> float | None:
        """``step_time_of`` a step of ``num_decodes`` plain decodes whose contexts after the step sum
        to ``context_sum``, for a model that needs no more of such a step; None: it needs each row."""
        return None


class RooflineCostModel(CostModel):
    """max(compute time, memory time) + a fixed per-step overhead.

    Compute: 2 FLOPs per parameter per token for the linear layers (the LM head only for
    sampled rows) plus 4·layers·heads·head_dim FLOPs per (query, key) pair of attention.
    Memory: every weight read once per step, every request's K/V context read, new K/V written.
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(self, dims: ModelDims, hw: Hardware) -> None:
        self.dims = dims
        self.hw = hw
        d = dims
        head = d.vocab_size * d.hidden_size
        self.linear_params = d.active_params - 2 * head  # a mixture of experts computes with its active ones
        self.head_params = head
        self.attn_flops_per_pair = 4 * d.num_layers * d.num_heads * d.head_dim
        self.kv_bytes_per_token = d.kv_bytes_per_token  # in the KV cache's dtype
        self.weight_bytes = d.num_params * d.bytes_per_param

    def step_time(self, batch: BatchShape) -> float:
        q, s = batch.query_lens, batch.seq_lens  # C-level sums
        return self._time(sum(q), sum(map(mul, q, s)), sum(map(mul, q, q)), sum(s), batch.num_sampled)

    def step_time_of(self, sched: SchedulerOutput) -> float:
        """``step_time`` from sums over the step's rows: the column-wise decodes summed as columns
        (one token each, context start + 1), no ``BatchShape`` built."""
        d = sched.decodes
        num_decodes = len(d)
        decode_seq = sum(d.starts) + num_decodes
        seq = query_seq = query_sq = sampled = 0
        for c in sched.chunks:
            q, end = c.num_tokens, c.start + c.num_tokens
            seq += end
            query_seq += q * end
            query_sq += q * q
            sampled += c.sample + c.num_draft_tokens
        return self._time(
            sched.num_batched_tokens,
            query_seq + decode_seq,
            query_sq + num_decodes,
            seq + decode_seq,
            sampled + num_decodes,
        )

    def decode_step_time(self, num_decodes: int, context_sum: int) -> float | None:
        return self._time(num_decodes, context_sum, num_decodes, context_sum, num_decodes)

    def _time(self, tokens: int, query_seq: int, query_sq: int, seq_lens: int, num_sampled: int) -> float:
        """From the sums over requests of q, q * s, q * q and s (q new tokens, s context after the step)."""
        if tokens == 0:
            return 0.0
        # sum over requests of q * (s - (q - 1) / 2): each query attends to its own prefix
        pairs = (2 * query_seq - query_sq + tokens) / 2
        flops: float = 2 * self.linear_params * tokens + 2 * self.head_params * num_sampled
        flops += self.attn_flops_per_pair * pairs
        bytes_moved = self.weight_bytes + self.kv_bytes_per_token * (seq_lens + tokens)
        compute = flops / (self.hw.flops * self.hw.flops_efficiency)
        memory = bytes_moved / (self.hw.mem_bw * self.hw.bw_efficiency)
        return max(compute, memory) + self.hw.step_overhead


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


class ProfiledCostModel(CostModel):
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


class Clock(ABC):
    """``now()`` in seconds since the run started. The engine calls ``step_started`` /
    ``step_finished`` around every step and ``wait_until`` when idle until an arrival."""

    simulated: bool = False

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def wait_until(self, t: float) -> None: ...

    def step_started(self) -> None:
        """Called before scheduling a step."""

    @abstractmethod
    def step_finished(self, sched: SchedulerOutput) -> None: ...

    def decode_step_ends(self, run: DecodeRun, deadline: float) -> list[float]:
        """For ``run``'s steps taken from now: the time each ends (what ``step_finished`` would advance
        to), up to the first that ends at or after ``deadline`` (the step after it would see an
        arrival). Nothing advances; ``wait_until`` the last commits them. Empty: this clock cannot
        tell a step's time before it is taken (the wall clock's default). A fast path
        (``forge.core.fast_paths``): the engine calls it only when the clock's own class sets
        ``fast_paths = True``, promising the times are those ``step_finished`` would give."""
        return []

    def bind(self, model: ModelDims) -> None:
        """Told the running model's dimensions once, before the first step."""


class WallClock(Clock):
    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    def step_finished(self, sched: SchedulerOutput) -> None:
        pass


class PredictedClock(Clock):
    """Simulated time: each step advances it by what ``cost_model`` predicts for the step's batch;
    waiting for an arrival jumps to it. A run is a pure function of its config.

    ``fast_paths``: use the cost model's fast paths (``step_time_of``, ``decode_step_time``) where its
    class declares them (``CostModel``); False (``engine.fast_paths=false``): ``step_time`` always."""

    simulated = True

    def __init__(self, fast_paths: bool = True) -> None:
        self._now = 0.0
        self.fast_paths = fast_paths

    @property
    @abstractmethod
    def cost_model(self) -> CostModel: ...

    def now(self) -> float:
        return self._now

    def wait_until(self, t: float) -> None:
        self._now = max(self._now, t)

    def step_finished(self, sched: SchedulerOutput) -> None:
        cost = self.cost_model
        if self.fast_paths and declares_fast_paths(cost):
            self._now += cost.step_time_of(sched)
        else:
            self._now += cost.step_time(BatchShape.of(sched))

    def decode_step_ends(self, run: DecodeRun, deadline: float) -> list[float]:
        cost = self.cost_model
        if not (self.fast_paths and declares_fast_paths(cost)):
            return []
        time_of = cost.decode_step_time
        t = self._now
        ends: list[float] = []
        append = ends.append
        for rows, context in run.step_shapes():
            dt = time_of(rows, context)
            if dt is None:
                return []
            t += dt
            append(t)
            if t >= deadline:
                break
        return ends


COST_MODELS = ("roofline", "operators")


class SimulatedClock(PredictedClock):
    """A cost model of ``model`` on ``hardware``. ``model``: a preset name from
    ``forge.models.presets``, or ``auto`` for the running model's own dimensions.

    ``cost``: ``operators`` (``forge.sim.operators``: per-operator times from
    ``conf/hardware/<hardware>.yaml``; the default: closest to Vidur, reports/fidelity) or ``roofline``
    (``RooflineCostModel``; the only one for ``hardware=cpu``). ``profile_dir``: a directory of Vidur operator
    profiles (``forge.sim.vidur_profile``), used instead of ``cost`` when set. ``tensor_parallel``: GPUs
    the model is split over (operators and Vidur profiles; the roofline models one GPU)."""

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(
        self,
        hardware: str = "h100",
        model: str = "auto",
        cost_model: CostModel | None = None,
        cost: str = "operators",
        tensor_parallel: int = 1,
        profile_dir: str | None = None,
        fast_paths: bool = True,
    ) -> None:
        super().__init__(fast_paths)
        self.hw = hardware_preset(hardware)
        if cost not in COST_MODELS:
            raise ValueError(f"unknown clock.cost {cost!r}; known: {list(COST_MODELS)}")
        if not isinstance(tensor_parallel, int) or tensor_parallel < 1:
            raise ValueError(f"clock.tensor_parallel must be an integer >= 1, got {tensor_parallel!r}")
        if tensor_parallel > 1 and cost == "roofline" and profile_dir is None and cost_model is None:
            raise ValueError("clock.tensor_parallel > 1 needs clock.cost=operators or clock.profile_dir")
        self.hardware, self.cost, self.tensor_parallel, self.profile_dir = hardware, cost, tensor_parallel, profile_dir
        self._preset = model
        self._cost = cost_model
        self._dims: ModelDims | None = None
        if profile_dir is not None and cost_model is None:
            from forge.sim.vidur_profile import check_profile_dir

            check_profile_dir(profile_dir, hardware, model)
        elif cost == "operators" and cost_model is None:
            from forge.sim.operators import OperatorConstants

            OperatorConstants.load(hardware)  # an unknown GPU fails here, at build time

    def bind(self, model: ModelDims) -> None:
        # A preset's transformer keeps the bound engine's KV cache dtype (int8/fp8 or not).
        if self._preset == "auto":
            self._dims = model
        else:
            self._dims = replace(model_dims(self._preset), kv_quantized=model.kv_quantized)
        if self._cost is not None:
            return
        if self.profile_dir is not None:
            from forge.sim.vidur_profile import VidurProfileCostModel

            self._cost = VidurProfileCostModel.load(
                self.profile_dir, self.hardware, self._preset, self._dims, self.tensor_parallel
            )
        elif self.cost == "operators":
            from forge.sim.operators import OperatorConstants, OperatorCostModel

            self._cost = OperatorCostModel(self._dims, OperatorConstants.load(self.hardware), self.tensor_parallel)
        else:
            self._cost = RooflineCostModel(self._dims, self.hw)

    @property
    def model_dims(self) -> ModelDims:
        """The dimensions of the transformer whose cost it charges (the preset, or the bound model's)."""
        if self._dims is None:
            raise RuntimeError("SimulatedClock.bind() must be called before asking its model")
        return self._dims

    @property
    def cost_model(self) -> CostModel:
        if self._cost is None:
            raise RuntimeError("SimulatedClock.bind() must be called before stepping")
        return self._cost


class ProfiledClock(PredictedClock):
    """Simulated time from a ``ProfiledCostModel`` fitted to ``profile`` (a CSV of measured steps,
    see ``python -m forge.calibrate``). KV memory is sized as for the wall clock
    (``engine.kv_cache_memory_gib``), i.e. like the engine that was measured."""

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(self, profile: str, fast_paths: bool = True) -> None:
        super().__init__(fast_paths)
        self.profile = profile
        self._cost = ProfiledCostModel.from_csv(profile)

    @property
    def cost_model(self) -> CostModel:
        return self._cost
