"""Capacity under an SLO: the highest request rate a configuration serves with enough requests on time.

DistServe's definition (Zhong et al., OSDI'24): a request attains the SLO when its TTFT <= ``ttft_s``
and its TPOT <= ``tpot_s`` (a one-token output has no TPOT and is judged on TTFT alone); the
*goodput* of a configuration is the highest rate at which the attained fraction stays >= ``attainment``,
and *goodput per GPU* divides it by the GPUs the configuration uses.

``search(overrides, slo)`` finds that rate by bisection on the workload's arrival rate: a Poisson /
gamma workload's ``workload.arrivals.rate``, or a trace's ``workload.time_scale`` (rate = the trace's
own request rate ÷ time_scale). It doubles (or halves) from the workload's own rate until the SLO is
missed (met), then bisects until the two bracketing rates are within ``tol`` (relative): the answer is
the met one, and the missed one just above it is kept beside it (``Capacity.above``) as the check.
Bisection assumes attainment falls as the rate rises; a probe table that contradicts it is reported
(``Capacity.monotone``). Under ``clock=simulated`` every probe, and so the answer, is deterministic."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from omegaconf import DictConfig

from forge.cluster.run import build_cluster
from forge.config import ConfigError, compose_config, validate
from forge.engine.build import default_sampling, workload_requests
from forge.engine.make import make


@dataclass(frozen=True)
class SLO:
    ttft_s: float
    tpot_s: float
    attainment: float = 0.9

    def __post_init__(self) -> None:
        for name, value in (("ttft", self.ttft_s), ("tpot", self.tpot_s)):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"capacity: the {name} SLO must be a finite number of seconds > 0, got {value}")
        if not 0 < self.attainment <= 1:
            raise ConfigError(f"capacity: the SLO attainment must be in (0, 1], got {self.attainment}")

    def attained(self, ttft: np.ndarray, tpot: np.ndarray) -> float:
        """The fraction of requests with TTFT and TPOT within the SLO (a request never served misses it)."""
        if not len(ttft):
            return 0.0
        ok = (ttft <= self.ttft_s) & (np.isnan(tpot) | (tpot <= self.tpot_s))
        return float(np.count_nonzero(ok & ~np.isnan(ttft))) / len(ttft)


@dataclass(frozen=True)
class Probe:
    rate: float  # requests/s offered
    attainment: float
    p90_ttft_s: float
    p90_tpot_s: float
    num_requests: int

    def meets(self, slo: SLO) -> bool:
        return self.attainment >= slo.attainment


@dataclass(frozen=True)
class Capacity:
    overrides: tuple[str, ...]
    slo: SLO
    rate: float  # the highest rate found that meets the SLO (0.0: none did)
    below: Probe | None  # the probe at ``rate``
    above: Probe | None  # the lowest rate found that misses it
    gpus: int
    probes: list[Probe] = field(default_factory=list)

    @property
    def goodput_per_gpu(self) -> float:
        return self.rate / self.gpus

    @property
    def monotone(self) -> bool:
        """Whether every probe that met the SLO ran at a lower rate than every probe that missed it."""
        met = [p.rate for p in self.probes if p.meets(self.slo)]
        missed = [p.rate for p in self.probes if not p.meets(self.slo)]
        return not met or not missed or max(met) < min(missed)


def gpus_of(cfg: DictConfig) -> int:
    """GPUs a configuration uses: tensor-parallel size (``engine.tensor_parallel_size`` or the simulated
    ``clock.tensor_parallel``) × replicas (prefill + decode pools when disaggregated)."""
    simulated_tp = cfg.clock.get("tensor_parallel", 1) if cfg.get("clock") is not None else 1
    tp = max(int(cfg.engine.get("tensor_parallel_size", 1) or 1), int(simulated_tp or 1))
    cluster = cfg.get("cluster")
    if cluster is None:
        return tp
    if cluster.get("prefill_replicas") is not None and cluster.get("decode_replicas") is not None:
        return tp * (int(cluster.prefill_replicas) + int(cluster.decode_replicas))
    return tp * int(cluster.get("replicas", 1) or 1)


class RateKnob:
    """How a workload's rate is set: ``workload.arrivals.rate`` or a trace's ``workload.time_scale``."""

    def __init__(self, cfg: DictConfig) -> None:
        workload = cfg.workload
        if workload.get("arrivals") is not None and workload.arrivals.get("rate") is not None:
            self.trace_rate = None
            self.base = float(workload.arrivals.rate)
        elif "time_scale" in workload and "path" in workload:
            try:
                rows = make("workload", workload).rows()[: workload.get("max_requests") or None]
            except ValueError as e:  # a bad trace row, named by its line
                raise ConfigError(f"workload: {e}") from e
            span = rows[-1].arrival_s - rows[0].arrival_s if len(rows) > 1 else 0.0
            if span <= 0:
                raise ConfigError("capacity: the trace needs two or more distinct arrival times to scale its rate")
            self.trace_rate = (len(rows) - 1) / span
            self.base = self.trace_rate / float(workload.time_scale)
        else:
            raise ConfigError("capacity: the workload has no arrival rate to scale (workload.arrivals.rate or a trace)")

    def overrides(self, rate: float) -> list[str]:
        if self.trace_rate is None:
            return [f"workload.arrivals.rate={rate!r}"]
        return [f"workload.time_scale={self.trace_rate / rate!r}"]


def probe(overrides: Sequence[str], knob: RateKnob, rate: float, slo: SLO) -> Probe:
    """One run of the configuration at ``rate``, on its cluster (one replica by default; in memory:
    nothing is written)."""
    cfg = compose_config([*overrides, *knob.overrides(rate), "progress=false", "report=false"])
    validate(cfg)
    default_sampling(cfg)
    cluster = build_cluster(cfg)
    try:
        requests = cluster.run(workload_requests(cfg, cluster.first), False).requests
    finally:
        cluster.close()
    ttft, tpot = requests["ttft"].to_numpy(dtype=float), requests["tpot"].to_numpy(dtype=float)
    return Probe(
        rate=rate,
        attainment=slo.attained(ttft, tpot),
        p90_ttft_s=_p90(ttft),
        p90_tpot_s=_p90(tpot),
        num_requests=len(ttft),
    )


def _p90(values: np.ndarray) -> float:
    kept = values[~np.isnan(values)]
    return float(np.percentile(kept, 90)) if len(kept) else math.nan


def search(
    overrides: Sequence[str], slo: SLO, start_rate: float | None = None, tol: float = 0.02, max_probes: int = 40
) -> Capacity:
    """The highest rate meeting ``slo`` for the configuration ``overrides`` (see the module docstring)."""
    if not 0 < tol < 1:
        raise ConfigError(f"capacity: the tolerance must be in (0, 1), got {tol}")
    cfg = compose_config([*overrides, "progress=false", "report=false"])
    knob = RateKnob(cfg)
    probes: list[Probe] = []

    def at(rate: float) -> Probe:
        if len(probes) == max_probes:
            raise ConfigError(f"capacity: no answer within {max_probes} runs (last rate {rate:g} req/s)")
        probes.append(probe(overrides, knob, rate, slo))
        return probes[-1]

    below, above = _bracket(at, start_rate or knob.base, slo)
    while below is not None and above is not None and above.rate > below.rate * (1 + tol):
        mid = at(math.sqrt(below.rate * above.rate))
        below, above = (mid, above) if mid.meets(slo) else (below, mid)
    rate = below.rate if below is not None else 0.0
    return Capacity(tuple(overrides), slo, rate, below, above, gpus_of(cfg), probes)


MIN_RATE = 1e-6
MAX_DOUBLINGS = 24  # 16 million times the first rate: the workload never loads the configuration


def _bracket(at: Any, rate: float, slo: SLO) -> tuple[Probe | None, Probe | None]:
    """A probe that meets the SLO and one at a higher rate that misses it (doubling or halving from ``rate``)."""
    first = at(rate)
    if first.meets(slo):
        below = first
        for _ in range(MAX_DOUBLINGS):
            nxt = at(below.rate * 2)
            if not nxt.meets(slo):
                return below, nxt
            below = nxt
        raise ConfigError(
            f"capacity: the SLO is met even at {below.rate:g} req/s: the workload is too small to load this "
            "configuration (more requests, or a tighter SLO)"
        )
    above = first
    while above.rate / 2 >= MIN_RATE:
        nxt = at(above.rate / 2)
        if nxt.meets(slo):
            return nxt, above
        above = nxt
    return None, above
