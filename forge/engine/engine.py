"""The engine: schedule -> run -> update, one step at a time (or, in ``run`` under a simulated clock,
consecutive plain-decode steps at once as a ``DecodeRun``, with the same outcome: a fast path, taken
only for components that declare it, ``forge.core.fast_paths``). What the engine does to its requests
outside a step (add, fork, abort, stop, the idle check) is its mixin ``forge.engine.engine_requests``."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping

from forge.core.decode_run import DecodeRun
from forge.core.fast_paths import declares_fast_paths, plain_components
from forge.core.outputs import RequestOutput, SchedulerOutput, stopped_output
from forge.core.request import Request
from forge.engine.engine_requests import EngineRequests, LeakError
from forge.engine.gc_pause import rare_gc
from forge.engine.progress import progress_bar
from forge.engine.runner_base import Runner
from forge.engine.speculator import Speculator
from forge.kvcache.base import KVUsage
from forge.models.base import ModelDims
from forge.results.metrics import MetricsRecorder
from forge.sched.scheduler import Scheduler
from forge.sched.step_outputs import StepOutputs
from forge.sim.clock import Clock, DecodeRunClock
from forge.spec.base import Drafter, SpecDecodeStats
from forge.tokenizers.base import Tokenizer

__all__ = ["MAX_RUN_STEPS", "Engine", "EngineDeadError", "LeakError"]

log = logging.getLogger("forge.engine.engine")

MAX_RUN_STEPS = 256  # the most steps one ``DecodeRun`` takes


class EngineDeadError(RuntimeError):
    """The engine cannot take another step (e.g. a tensor-parallel rank died): ``step`` raises it
    instead of failing the step's requests and going on."""


class Engine(EngineRequests):
    """Steps the scheduler, the runner and the clock (``step``), or runs a list of requests to the
    end (``run``). ``fast_paths`` (``engine.fast_paths``): in ``run``, take a ``DecodeRun``
    (consecutive steps of plain decodes, computed at once) wherever the scheduler, runner and clock
    can and the policy, KV cache, clock and model declare it (``decode_runs``); the outputs and the
    metrics are those of stepping through it (tested). False: step by step."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: Runner,
        clock: Clock,
        recorder: MetricsRecorder | None = None,
        drafter: Drafter | None = None,
        dims: ModelDims | None = None,
        fast_paths: bool = True,
    ) -> None:
        """``dims``: what the clock charges for (the model's own when None; ``build_engine`` passes
        them with the KV cache's dtype). ``fast_paths``: whether ``run`` may take decode runs."""
        self.scheduler = scheduler
        self.runner = runner
        self.clock = clock
        self.recorder = recorder or MetricsRecorder()
        self.requests: dict[str, Request] = {}
        self.speculator = Speculator(drafter)
        self._fast_paths = fast_paths
        clock.bind(dims or runner.model.dims)
        # what decides decode runs and is fixed for the engine's life (the runner's host path may change)
        # the clock that times decode runs: a declaring DecodeRunClock that can now (``decode_runs``)
        run_clock = clock if isinstance(clock, DecodeRunClock) and declares_fast_paths(clock) else None
        self._run_clock = run_clock if fast_paths and run_clock is not None and run_clock.decode_runs else None
        self._runs = self._run_clock is not None and scheduler.takes_decode_runs

    @property
    def fast_paths(self) -> bool:
        """``engine.fast_paths``, as built (False: every step through the plain loop)."""
        return self._fast_paths

    @property
    def decode_runs(self) -> bool:
        """Whether ``run`` takes decode runs where it can: fast paths on, a runner that computes them
        (a declaring ``DecodeRunModel`` on the host path), a clock, a policy and a KV cache that
        declare them (``forge.core.fast_paths``)."""
        return self._runs and self.runner.decode_runs

    def plain_components(self) -> list[str]:
        """The components whose class declares no fast paths (so each runs the plain path), as
        ``group: ClassName``; the model only where a host path exists for it."""
        clock = self.clock
        parts = {"scheduler": self.scheduler.policy, "kvcache": self.scheduler.kv, **self.runner.fast_path_components()}
        if clock.simulated:  # a wall clock has no fast paths to take
            parts["clock"] = clock
            parts.update(clock.fast_path_components() if isinstance(clock, DecodeRunClock) else {})
        return plain_components(parts)

    @property
    def drafter(self) -> Drafter | None:
        return self.speculator.drafter

    @property
    def spec_stats(self) -> SpecDecodeStats:
        return self.speculator.stats

    @property
    def tokenizer(self) -> Tokenizer:
        return self.runner.model.tokenizer

    def close(self) -> None:
        """Release what the runner holds outside this process (tensor-parallel ranks); idempotent."""
        self.runner.close()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[RequestOutput]:
        """One step's outputs: one per request that sampled, including the requests that failed
        this step (``finish_reason="error"``, ``error`` set; see ``_step``)."""
        ran = self._step()
        return ran.outputs if ran is not None else []

    def step_outputs(self) -> tuple[StepOutputs, bool]:
        """``step``'s outputs (column-wise, as ``Scheduler.update`` gives them) and whether the step
        ran (False: nothing could be scheduled), as vLLM V1's ``EngineCore.step``."""
        ran = self._step()
        return (ran, True) if ran is not None else (StepOutputs(), False)

    def _step(self) -> StepOutputs | None:
        """One step: the scheduler's outputs, then the final outputs of the requests that failed.

        A failure stays with the requests it concerns: a request whose sampling, constraint or
        verification raised (``ModelOutput.failed``) is aborted (its KV blocks freed) and finished
        with the error while the rest of the batch goes on; if the model step itself raises, every
        request of the step fails that way and the engine continues with the others, unless it raised
        ``EngineDeadError``, which ``step`` raises. None if nothing could be scheduled."""
        self.clock.step_started()
        start = self.clock.now()
        self.speculator.propose(self.scheduler.running, self.scheduler.limits.max_model_len)
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return None
        outputs = self._execute(sched)
        self._record(sched, outputs, start)
        return outputs

    def _execute(self, sched: SchedulerOutput, run: DecodeRun | None = None) -> StepOutputs:
        """Run the step and update the scheduler: its outputs, with the final outputs of the requests
        that failed (all of the step's if the model step raised). ``run``: the step's decodes as
        ``Scheduler.schedule_joining`` took them (updated column-wise unless a request failed)."""
        try:
            out = self.runner.execute(sched)
        except EngineDeadError:
            raise
        except Exception as exc:
            log.error("the model step failed; failing its %d requests", sched.num_rows, exc_info=exc)
            reason = f"the model step failed ({type(exc).__name__})"
            rows = dict.fromkeys([r.request_id for r in sched.requests], reason)
            return StepOutputs(others=self._fail(rows, step_failed=True))
        self.speculator.record(sched, out)
        failed = self._fail(out.failed) if out.failed else []
        eos = self.tokenizer.eos_token_ids
        if run is not None and not failed:
            outputs = self.scheduler.update_joining(sched, run, out, eos)
        else:
            outputs = self.scheduler.update(sched, out, eos)
        return outputs.with_others(failed) if failed else outputs

    def _record(self, sched: SchedulerOutput, outputs: StepOutputs, start: float) -> None:
        """Advance the clock past the step, record it, and let the finished requests go."""
        self.clock.step_finished(sched)
        kv = self.scheduler.kv.usage(self.scheduler.running)
        self.recorder.on_step(sched, outputs, self.requests, start, self.clock.now(), kv, len(self.scheduler.running))
        for o in outputs.finished:
            del self.requests[o.request_id]
            self.speculator.forget(o.request_id)

    def _fail(self, errors: Mapping[str, str], step_failed: bool = False) -> list[RequestOutput]:
        """Abort each request of ``errors`` (request id -> reason) in the scheduler, freeing its KV
        blocks (``step_failed``: the model step raised, so what it was to write is discarded); their
        final outputs (``finish_reason="error"``). They leave ``requests`` with the step's other
        finished requests."""
        outputs = []
        for rid, reason in errors.items():
            request = self.requests[rid]
            self.scheduler.abort(rid, step_failed)
            outputs.append(stopped_output(request, "error", reason))
        return outputs

    def run(self, requests: Iterable[Request], progress: bool = False) -> dict[str, RequestOutput]:
        """Feed requests at their ``arrival_time`` (seconds from now) and step until all finish.

        While it runs, Python's cyclic GC runs less often (see ``forge.engine.gc_pause.rare_gc``)."""
        with rare_gc():
            return self._run(requests, progress)

    def _run(self, requests: Iterable[Request], progress: bool) -> dict[str, RequestOutput]:
        pending = sorted(requests, key=lambda r: r.arrival_time)
        finals: dict[str, RequestOutput] = {}
        offset = self.clock.now()
        i = 0
        with progress_bar(len(pending), progress) as bar:
            while (unfinished := self.has_unfinished()) or i < len(pending):
                if not unfinished:
                    self.clock.wait_until(offset + pending[i].arrival_time)
                now = self.clock.now()
                while i < len(pending) and offset + pending[i].arrival_time <= now:
                    pending[i].arrival_time += offset
                    self.add_request(pending[i])
                    i += 1
                next_arrival = offset + pending[i].arrival_time if i < len(pending) else math.inf
                for out in self.advance(next_arrival):
                    finals[out.request_id] = out
                    bar.update(1)
        self.check_idle()
        return finals

    def advance(self, next_arrival: float) -> list[RequestOutput]:
        """The finished outputs of the next step, or of the next steps as one ``DecodeRun`` when the
        runner, the scheduler and the clock can take one: the same steps, ending before the one that
        would see ``next_arrival`` (the clock's time of the next request this engine may be given;
        ``math.inf``: none). What ``run`` calls between arrivals, and a cluster for each replica
        (``forge.cluster``). A step whose decodes are every running request's (an arrival joining
        them) takes them column-wise (``_joining_step``), then, if it ends before ``next_arrival``, the
        decode run that the next call would take (the same deadline): one call per arrival, the same steps."""
        if self.drafter is None and self.decode_runs:
            if not len(self.scheduler.waiting) and (done := self._try_decode_run(next_arrival)) is not None:
                return done  # (a run plans nothing while a request waits: an arrival's call goes on to join)
            if (joined := self._joining_step()) is not None:
                finished = joined.finished
                if self.clock.now() < next_arrival and (done := self._try_decode_run(next_arrival)) is not None:
                    return finished + done if finished else done
                return finished
        ran = self._step()
        return ran.finished if ran is not None else []

    def _try_decode_run(self, next_arrival: float) -> list[RequestOutput] | None:
        """The finished outputs of the decode run up to ``next_arrival``; None, nothing changed, if none is taken."""
        plan = self.scheduler.plan_decode_run(MAX_RUN_STEPS)
        if plan is not None and (ends := self._decode_step_ends(plan, next_arrival)):
            run = plan.truncated(len(ends))
            if (usage := self.scheduler.start_decode_run(run)) is not None:
                return self._decode_run(self.runner, run, ends, usage)
        return None

    def _joining_step(self) -> StepOutputs | None:
        """``_step``, when the step is every running request's plain decode and then admissions (an arrival
        joining a batch of decodes, ``Scheduler.schedule_joining``): the decodes taken column-wise, the same
        step; None, nothing changed, otherwise."""
        joined = self.scheduler.schedule_joining()
        if joined is None:
            return None
        sched, run = joined
        self.clock.step_started()
        start = self.clock.now()
        outputs = self._execute(sched, run)
        self._record(sched, outputs, start)
        return outputs

    def _decode_step_ends(self, run: DecodeRun, deadline: float) -> list[float]:
        return self._run_clock.decode_step_ends(run, deadline) if self._run_clock is not None else []

    def _decode_run(
        self, runner: Runner, run: DecodeRun, ends: list[float], usage: list[KVUsage]
    ) -> list[RequestOutput]:
        """Take ``run``'s steps (started: its slots reserved, ``usage`` after each), which end at ``ends``:
        what stepping through them records and returns."""
        start = self.clock.now()
        finished = self.scheduler.finish_decode_run(run, runner.execute_decode_run(run))
        self.clock.wait_until(ends[-1])
        self.recorder.on_decode_run(run, start, ends, usage)
        outputs = StepOutputs(finished_decodes=finished).finished
        for request in finished:
            del self.requests[request.request_id]
        return outputs
