"""Time for the engine: the wall clock, or a simulated clock charging each step what a cost model
(``forge.sim.cost_model``) predicts for its batch on a named piece of hardware."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import replace

from forge.core.decode_run import DecodeRun
from forge.core.fast_paths import declares_fast_paths
from forge.core.outputs import SchedulerOutput
from forge.models.base import ModelDims
from forge.models.presets import model_dims
from forge.sim.cost_model import BatchShape, CostModel, FastCostModel, hardware_preset
from forge.sim.profiled import ProfiledCostModel
from forge.sim.roofline import RooflineCostModel


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


class DecodeRunClock(ABC):
    """The optional interface of a clock that can time a ``DecodeRun`` before it is taken, used by the
    engine only when the clock's own class also sets ``fast_paths = True`` (``forge.core.fast_paths``),
    promising the times are those ``step_finished`` would give.

    - ``decode_runs``: whether it can time runs now (e.g. its cost model has that fast path).
    - ``decode_step_ends(run, deadline)``: for ``run``'s steps taken from now, the time each ends, up to
      the first that ends at or after ``deadline`` (the step after it would see an arrival). Nothing
      advances; ``wait_until`` the last commits them. Empty: it cannot time this run.
    - ``fast_path_components()``: the components whose declarations its fast paths rely on, by name."""

    @property
    @abstractmethod
    def decode_runs(self) -> bool: ...

    @abstractmethod
    def decode_step_ends(self, run: DecodeRun, deadline: float) -> list[float]: ...

    @abstractmethod
    def fast_path_components(self) -> dict[str, object]: ...


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


class PredictedClock(Clock, DecodeRunClock):
    """Simulated time: each step advances it by what ``cost_model`` predicts for the step's batch;
    waiting for an arrival jumps to it. A run is a pure function of its config.

    ``fast_paths``: use the cost model's fast paths (``FastCostModel``: ``step_time_of``,
    ``decode_step_time``) where its class declares them; False (``engine.fast_paths=false``):
    ``step_time`` always."""

    simulated = True

    def __init__(self, fast_paths: bool = True) -> None:
        self._now = 0.0
        self.fast_paths = fast_paths
        self._fast: tuple[CostModel, FastCostModel | None] | None = None  # (cost model, itself if fast): _fast_cost

    @property
    @abstractmethod
    def cost_model(self) -> CostModel: ...

    def now(self) -> float:
        return self._now

    def wait_until(self, t: float) -> None:
        self._now = max(self._now, t)

    def _fast_cost(self) -> FastCostModel | None:
        """The cost model when its fast paths may be taken, else None (decided once per cost model:
        this runs every step)."""
        cost = self.cost_model
        if self._fast is None or self._fast[0] is not cost:
            ok = self.fast_paths and declares_fast_paths(cost)
            self._fast = (cost, cost if ok and isinstance(cost, FastCostModel) else None)
        return self._fast[1]

    def step_finished(self, sched: SchedulerOutput) -> None:
        fast = self._fast_cost()
        if fast is not None:
            self._now += fast.step_time_of(sched)
        else:
            self._now += self.cost_model.step_time(BatchShape.of(sched))

    @property
    def decode_runs(self) -> bool:
        return self._fast_cost() is not None

    def fast_path_components(self) -> dict[str, object]:
        return {"cost model": self.cost_model}

    def decode_step_ends(self, run: DecodeRun, deadline: float) -> list[float]:
        fast = self._fast_cost()
        if fast is None:
            return []
        time_of = fast.decode_step_time
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
    event_runs = True  # its steps are those of forge.sim.event_replica's model, where it applies

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
