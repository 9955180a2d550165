"""The engine: schedule -> run -> update, one step at a time."""

from __future__ import annotations

from collections.abc import Iterable

from tqdm import tqdm

from forge.clock import Clock
from forge.metrics import MetricsRecorder
from forge.outputs import RequestOutput
from forge.request import Request
from forge.runner import ModelRunner
from forge.scheduler import Scheduler
from forge.tokenizer import Tokenizer


class LeakError(RuntimeError):
    """The engine went idle while KV blocks or requests were still held."""


class Engine:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        clock: Clock,
        recorder: MetricsRecorder | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.clock = clock
        self.recorder = recorder or MetricsRecorder()
        self.requests: dict[str, Request] = {}
        clock.bind(runner.model.dims)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.runner.model.tokenizer

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.scheduler.add_request(request)
        self.requests[request.request_id] = request
        self.recorder.on_arrival(request, request.arrival_time)

    def abort(self, request_id: str) -> bool:
        request = self.scheduler.abort(request_id)
        self.requests.pop(request_id, None)
        return request is not None

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def step(self) -> list[RequestOutput]:
        self.clock.step_started()
        start = self.clock.now()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return []
        out = self.runner.execute(sched, self.requests)
        outputs = self.scheduler.update(sched, out, self.tokenizer.eos_token_ids)
        self.clock.step_finished(sched)
        kv = self.scheduler.kv.usage(self.scheduler.running)
        self.recorder.on_step(sched, outputs, self.requests, start, self.clock.now(), kv, len(self.scheduler.running))
        for o in outputs:
            if o.finished:
                del self.requests[o.request_id]
        return outputs

    def check_idle(self) -> None:
        """Every request finished and every block free; raises LeakError otherwise."""
        kv = self.scheduler.kv
        problems = []
        if self.scheduler.num_unfinished:
            problems.append(f"{self.scheduler.num_unfinished} requests unfinished")
        if kv.num_held():
            problems.append(f"{kv.num_held()} requests still hold KV blocks")
        if kv.num_free_blocks() != kv.num_blocks:
            problems.append(f"{kv.num_blocks - kv.num_free_blocks()} of {kv.num_blocks} KV blocks not free")
        if problems:
            raise LeakError("engine idle but " + "; ".join(problems))

    def run(self, requests: Iterable[Request], progress: bool = False) -> dict[str, RequestOutput]:
        """Feed requests at their ``arrival_time`` (seconds from now) and step until all finish."""
        pending = sorted(requests, key=lambda r: r.arrival_time)
        finals: dict[str, RequestOutput] = {}
        offset = self.clock.now()
        i = 0
        with tqdm(total=len(pending), disable=not progress, unit="req", desc="forge") as bar:
            while i < len(pending) or self.has_unfinished():
                if not self.has_unfinished() and i < len(pending):
                    self.clock.wait_until(offset + pending[i].arrival_time)
                now = self.clock.now()
                while i < len(pending) and offset + pending[i].arrival_time <= now:
                    pending[i].arrival_time += offset
                    self.add_request(pending[i])
                    i += 1
                for out in self.step():
                    if out.finished:
                        finals[out.request_id] = out
                        bar.update(1)
        self.check_idle()
        return finals
