"""Time for the engine: the wall clock, or a simulated clock charging each step what a cost
model predicts for its batch on a named piece of hardware."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from forge.models.base import ModelDims
from forge.models.presets import model_dims
from forge.outputs import SchedulerOutput


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
    "h100": Hardware("H100-SXM5-80GB", 989e12, 3.35e12, 80e9, step_overhead=3e-4),
    "h200": Hardware("H200-SXM-141GB", 989e12, 4.8e12, 141e9, step_overhead=3e-4),
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
        return cls(
            query_lens=[s.num_tokens for s in sched.scheduled],
            seq_lens=[s.start + s.num_tokens for s in sched.scheduled],
            num_sampled=sum(1 + s.num_draft_tokens for s in sched.scheduled if s.sample),
        )


class CostModel(ABC):
    """Predicted seconds for one engine step."""

    @abstractmethod
    def step_time(self, batch: BatchShape) -> float: ...


class RooflineCostModel(CostModel):
    """max(compute time, memory time) + a fixed per-step overhead.

    Compute: 2 FLOPs per parameter per token for the linear layers (the LM head only for
    sampled rows) plus 4·layers·heads·head_dim FLOPs per (query, key) pair of attention.
    Memory: every weight read once per step, every request's K/V context read, new K/V written.
    """

    def __init__(self, dims: ModelDims, hw: Hardware) -> None:
        self.dims = dims
        self.hw = hw
        d = dims
        head = d.vocab_size * d.hidden_size
        self.linear_params = d.num_params - 2 * head
        self.head_params = head
        self.attn_flops_per_pair = 4 * d.num_layers * d.num_heads * d.head_dim
        self.kv_bytes_per_token = 2 * d.num_layers * d.num_kv_heads * d.head_dim * d.bytes_per_param
        self.weight_bytes = d.num_params * d.bytes_per_param

    def step_time(self, batch: BatchShape) -> float:
        tokens: int = sum(batch.query_lens)
        if tokens == 0:
            return 0.0
        pairs: float = sum(q * (s - (q - 1) / 2) for q, s in zip(batch.query_lens, batch.seq_lens, strict=True))
        flops: float = 2 * self.linear_params * tokens + 2 * self.head_params * batch.num_sampled
        flops += self.attn_flops_per_pair * pairs
        bytes_moved = self.weight_bytes + self.kv_bytes_per_token * (sum(batch.seq_lens) + tokens)
        compute = flops / (self.hw.flops * self.hw.flops_efficiency)
        memory = bytes_moved / (self.hw.mem_bw * self.hw.bw_efficiency)
        return max(compute, memory) + self.hw.step_overhead


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


class SimulatedClock(Clock):
    """Time advances only by predicted step costs and idle jumps: a run is a pure function of
    its config. ``model``: a preset name from ``forge.models.presets``, or ``auto`` for the
    running model's own dimensions."""

    simulated = True

    def __init__(self, hardware: str = "h100", model: str = "auto", cost_model: CostModel | None = None) -> None:
        self.hw = hardware_preset(hardware)
        self._preset = model
        self._cost = cost_model
        self._now = 0.0

    def bind(self, model: ModelDims) -> None:
        if self._cost is None:
            dims = model if self._preset == "auto" else model_dims(self._preset)
            self._cost = RooflineCostModel(dims, self.hw)

    @property
    def cost_model(self) -> CostModel:
        if self._cost is None:
            raise RuntimeError("SimulatedClock.bind() must be called before stepping")
        return self._cost

    def now(self) -> float:
        return self._now

    def wait_until(self, t: float) -> None:
        self._now = max(self._now, t)

    def step_finished(self, sched: SchedulerOutput) -> None:
        self._now += self.cost_model.step_time(BatchShape.of(sched))
