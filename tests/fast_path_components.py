"""User components written as the README shows (one class, plugged in by ``_target_``), each doing
something a fast path could skip: hooks with state, overridden methods, a cost model, a clock, a model
and a drafter of their own. ``tests/test_fast_paths.py`` runs each with fast paths on and off.

Each counts its hook calls in a class-level list of counts per instance (``calls``) so a test can
compare what the plain loop called with what the fast path called, without reaching into the engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from forge.core.decode_run import DecodeRun
from forge.core.outputs import SchedulerOutput
from forge.core.request import Request
from forge.kvcache.base import KVUsage
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.models.presets import model_dims
from forge.models.synthetic import SyntheticModel
from forge.policies.base import Policy
from forge.policies.fcfs import FCFS
from forge.policies.sarathi import Sarathi
from forge.sim.clock import SimulatedClock
from forge.sim.cost_model import BatchShape, hardware_preset
from forge.sim.roofline import RooflineCostModel
from forge.spec.base import Draft
from forge.spec.ngram import NgramDrafter
from forge.tokenizers.base import Tokenizer
from forge.workloads.synthetic import RequestSpec, Workload


class Calls:
    """Counts of hook calls, by hook name (one per component instance)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1


class AlternatingBudget(Policy):
    """FCFS whose token budget is cut to a quarter every other step: a feedback or SLO-aware budget's shape."""

    def __init__(self) -> None:
        self.calls = Calls()

    def waiting_key(self, request: Request) -> tuple[float, str]:
        return (request.arrival_time, request.request_id)

    def token_budget(self, engine_budget: int) -> int:
        self.calls.add("token_budget")
        n = self.calls.counts["token_budget"]
        return engine_budget if n % 2 else max(1, engine_budget // 4)


class RotatingOrder(FCFS):
    """A shipped policy's subclass whose running order rotates by one each step (round robin)."""

    def __init__(self) -> None:
        self.calls = Calls()

    def running_order(self, running: list[Request]) -> list[Request]:
        self.calls.add("running_order")
        if not running:
            return running
        k = self.calls.counts["running_order"] % len(running)
        return running[k:] + running[:k]


class CappedSarathi(Sarathi):
    """A shipped policy's subclass that changes nothing but counts its budget calls."""

    def __init__(self, chunk_size: int | None = None) -> None:
        super().__init__(chunk_size)
        self.calls = Calls()

    def token_budget(self, engine_budget: int) -> int:
        self.calls.add("token_budget")
        return super().token_budget(engine_budget)


class DeclaredSJF(Policy):
    """A user policy that declares fast paths (its hooks are pure): it gets decode runs."""

    fast_paths = True

    def waiting_key(self, request: Request) -> tuple[int, float, str]:
        return (len(request.prompt_token_ids), request.arrival_time, request.request_id)


class CountingPaged(PagedKVCache):
    """The paged cache with ``allocate_slots`` overridden: it counts, and refuses every 97th call
    (as a cache with its own admission rule might), which changes the schedule if skipped."""

    def __init__(self, ctx: KVCacheContext, **settings: Any) -> None:
        super().__init__(ctx, **settings)
        self.calls = Calls()

    def allocate_slots(self, request: Request, num_tokens: int, num_cacheable: int) -> bool:
        self.calls.add("allocate_slots")
        if self.calls.counts["allocate_slots"] % 97 == 0:
            return False
        return super().allocate_slots(request, num_tokens, num_cacheable)


class JitterCost(RooflineCostModel):
    """The roofline with a step time of its own: +2% on every third step (a noisy GPU)."""

    def __init__(self) -> None:
        super().__init__(model_dims("llama-3-8b"), hardware_preset("a100"))
        self.calls = Calls()

    def step_time(self, batch: BatchShape) -> float:
        self.calls.add("step_time")
        base = super().step_time(batch)
        return base * 1.02 if self.calls.counts["step_time"] % 3 == 0 else base


class OverheadClock(SimulatedClock):
    """The simulated clock charging a scheduling overhead that grows with each step it sees."""

    def __init__(self, **settings: object) -> None:
        super().__init__(**settings)  # type: ignore[arg-type]
        self.calls = Calls()

    def step_finished(self, sched: SchedulerOutput) -> None:
        super().step_finished(sched)
        self.calls.add("step_finished")
        overhead = 1e-6 * (self.calls.counts["step_finished"] % 5) + 1e-7 * len(sched.scheduled)  # rows, as documented
        self.wait_until(self.now() + overhead)


class ShiftedModel(SyntheticModel):
    """The synthetic model with a different next token (a user's own stand-in model)."""

    def next_token(self, context: tuple[int, ...], position: int) -> int:
        return 40 + (sum(context) + 7 * position) % 60


class MoodyDrafter(NgramDrafter):
    """The n-gram drafter proposing nothing on every third call (state across steps)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.calls = Calls()

    def propose(self, requests: Sequence[Request], limits: Mapping[str, int]) -> dict[str, Draft]:
        self.calls.add("propose")
        if self.calls.counts["propose"] % 3 == 0:
            return {}
        return super().propose(requests, limits)


class StaircaseWorkload(Workload):
    """Bursts of requests with lengths that step up within a burst (a user's own workload)."""

    def __init__(self, num_requests: int = 36, seed: int = 0) -> None:
        self.num_requests = num_requests
        self.seed = seed

    def requests(self, tokenizer: Tokenizer, max_prompt_len: int | None = None) -> list[RequestSpec]:
        specs = []
        for i in range(self.num_requests):
            burst, k = divmod(i, 6)
            prompt = [40 + (i * 7 + j + self.seed) % 80 for j in range(12 + 9 * k)]
            specs.append(RequestSpec(f"s{i}", 0.25 * burst, prompt, 8 + 5 * k))
        return specs


class RunRefusingPaged(PagedKVCache):
    """A user cache that declares fast paths and overrides ``reserve_decode_run`` with a rule of its own:
    it counts each reservation and refuses every one (a cache keeping its blocks for something else), so
    every decode run and every joining step falls back to stepping."""

    fast_paths = True

    def __init__(self, ctx: KVCacheContext, **settings: Any) -> None:
        super().__init__(ctx, **settings)
        self.calls = Calls()

    def reserve_decode_run(self, run: DecodeRun) -> list[KVUsage] | None:
        self.calls.add("reserve_decode_run")
        return None
