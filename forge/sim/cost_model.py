"""The cost-model contract: what a simulated clock asks of a model of step times (``CostModel``),
the batch it sees of a step (``BatchShape``), and the hardware presets the shipped models charge
(``Hardware``, ``hardware_preset``). Implementations: ``forge.sim.roofline``, ``forge.sim.operators``,
``forge.sim.vidur_profile``, ``forge.sim.profiled``; the clocks that use them: ``forge.sim.clock``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from forge.core.outputs import SchedulerOutput


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
    """Predicted seconds for one engine step: ``step_time`` of the step's ``BatchShape`` (what a
    ``PredictedClock`` charges; its fast path is the optional ``FastCostModel`` interface below)."""

    @abstractmethod
    def step_time(self, batch: BatchShape) -> float: ...


class FastCostModel(ABC):
    """The optional interface of a cost model with fast paths (``forge.core.fast_paths``), used by a
    ``PredictedClock`` only when the cost model's own class also sets ``fast_paths = True``, promising
    both equal ``step_time`` bit for bit:

    - ``step_time_of(sched)``: the step's time computed from the ``SchedulerOutput`` directly;
    - ``decode_step_time(num_decodes, context_sum)``: a step of ``num_decodes`` plain decodes whose
      contexts after the step sum to ``context_sum`` (for decode runs); None: it needs each row."""

    @abstractmethod
    def step_time_of(self, sched: SchedulerOutput) -> float: ...

    @abstractmethod
    def decode_step_time(self, num_decodes: int, context_sum: int) -> float | None: ...
