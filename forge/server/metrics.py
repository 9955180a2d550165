"""Prometheus metrics with vLLM's names under a ``forge:`` prefix, fed by the engine thread.

``ServingRecorder`` replaces the engine's recorder in served mode: it keeps the offline
recorder's bookkeeping for requests in flight only (timelines are dropped when a request ends,
step records are capped), and observes latencies as they happen. ``ServerMetrics.sync(engine)``
copies gauges and cumulative counters after each step. Each app owns its registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from forge.core.outputs import SchedulerOutput
from forge.core.request import Request
from forge.engine.engine import Engine
from forge.kvcache.base import KVUsage
from forge.results.metrics import MetricsRecorder
from forge.sched.step_outputs import StepOutputs

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self.model_name = model_name

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"forge:{name}", doc, labels, registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(f"forge:{name}", doc, [*labels, *extra], registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> Histogram:
            return Histogram(f"forge:{name}", doc, labels, buckets=buckets, registry=r)

        self.running = gauge("num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage (1 = full).")
        self.cache_config = Gauge(
            "forge:cache_config_info",
            "The KV cache's size (vLLM's cache_config_info): its block_size and num_gpu_blocks labels; value 1.",
            [*labels, "block_size", "num_gpu_blocks"],
            registry=r,
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens received.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.preemptions = counter("num_preemptions", "Preemptions.")
        self.success = counter("request_success", "Finished requests by finish reason.", ("finished_reason",))
        self.prefix_queries = counter("prefix_cache_queries", "Prefix-cache queries (tokens).")
        self.prefix_hits = counter("prefix_cache_hits", "Prefix-cache hits (tokens).")
        self.spec_drafts = counter("spec_decode_num_drafts", "Draft proposals verified.")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.ttft = hist("time_to_first_token_seconds", "Time to first token.")
        self.itl = hist("inter_token_latency_seconds", "Time between consecutive token batches.", _ITL_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to finish.")
        self.queue = hist("request_queue_time_seconds", "Arrival to first scheduled.")
        self.prefill = hist("request_prefill_time_seconds", "First scheduled to first token.")
        self.decode = hist("request_decode_time_seconds", "First token to finish.")
        self._last: dict[str, int] = {}

    def _advance(self, counter: Counter, key: str, total: int) -> None:
        delta = total - self._last.get(key, 0)
        if delta > 0:
            counter.labels(self.model_name).inc(delta)
        self._last[key] = total

    def sync(self, engine: Engine) -> None:
        """Gauges and cumulative engine counters (called by the engine thread after a step)."""
        s = engine.scheduler
        m = self.model_name
        self.running.labels(m).set(len(s.running))
        self.waiting.labels(m).set(s.num_unfinished - len(s.running))
        self.kv_usage.labels(m).set(s.kv.usage_fraction)
        stats = s.kv.stats()
        self._advance(self.preemptions, "preemptions", s.num_preemptions)
        self._advance(self.prefix_queries, "prefix_queries", int(stats.get("prefix_cache_queries", 0)))
        self._advance(self.prefix_hits, "prefix_hits", int(stats.get("prefix_cache_hits", 0)))
        spec = getattr(engine, "spec_stats", None)
        if spec is not None:
            self._advance(self.spec_drafts, "spec_drafts", spec.num_drafts)
            self._advance(self.spec_draft_tokens, "spec_draft_tokens", spec.num_draft_tokens)
            self._advance(self.spec_accepted, "spec_accepted", spec.num_accepted_tokens)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))

    def ensure_labels(self, block_size: int, num_blocks: int) -> None:
        """Zero-valued series exist from the start (dashboards see 0, not nothing); the cache's size is set."""
        m = self.model_name
        self.cache_config.labels(m, str(block_size), str(num_blocks)).set(1)
        for c in (self.prompt_tokens, self.generation_tokens, self.preemptions, self.prefix_queries, self.prefix_hits):
            c.labels(m)
        for c in (self.spec_drafts, self.spec_draft_tokens, self.spec_accepted):
            c.labels(m)
        for reason in ("stop", "length", "abort"):
            self.success.labels(m, reason)
        for g in (self.running, self.waiting, self.kv_usage):
            g.labels(m).set(0)


class ServingRecorder(MetricsRecorder):
    """The offline recorder's bookkeeping for live requests, plus Prometheus observations."""

    def __init__(self, metrics: ServerMetrics, max_steps: int = 4096) -> None:
        super().__init__()
        self.metrics = metrics
        self.max_steps = max_steps

    def on_arrival(self, request: Request, t: float) -> None:
        super().on_arrival(request, t)
        self.metrics.prompt_tokens.labels(self.metrics.model_name).inc(request.num_prompt_tokens)

    def on_step(
        self,
        sched: SchedulerOutput,
        outputs: StepOutputs,
        requests: dict[str, Request],
        start: float,
        end: float,
        kv: KVUsage,
        num_running: int,
    ) -> None:
        before = {o.request_id: len(self.requests[o.request_id].token_times) for o in outputs}
        super().on_step(sched, outputs, requests, start, end, kv, num_running)
        m = self.metrics
        name = m.model_name
        for out in outputs:
            tl = self.requests[out.request_id]
            n_before = before[out.request_id]
            if out.new_token_ids:
                m.generation_tokens.labels(name).inc(len(out.new_token_ids))
                if n_before == 0:
                    m.ttft.labels(name).observe(end - tl.arrival_time)
                    if tl.first_scheduled_time is not None:
                        m.prefill.labels(name).observe(end - tl.first_scheduled_time)
                else:
                    m.itl.labels(name).observe(end - tl.token_times[n_before - 1])
            if out.finished:
                m.success.labels(name, out.finish_reason or "stop").inc()
                m.e2e.labels(name).observe(end - tl.arrival_time)
                if tl.first_scheduled_time is not None:
                    m.queue.labels(name).observe(tl.first_scheduled_time - tl.arrival_time)
                if tl.token_times:
                    m.decode.labels(name).observe(end - tl.token_times[0])
                del self.requests[out.request_id]
        if len(self.steps) > self.max_steps:
            del self.steps[: len(self.steps) - self.max_steps // 2]

    def on_abort(self, request_id: str, reason: str = "abort") -> None:
        """A request ended by the server: ``abort`` (client gone, shutdown) or ``stop`` (a stop string)."""
        tl = self.requests.pop(request_id, None)
        if tl is not None:
            self.metrics.success.labels(self.metrics.model_name, reason).inc()
            if tl.token_times:
                self.metrics.e2e.labels(self.metrics.model_name).observe(tl.token_times[-1] - tl.arrival_time)
