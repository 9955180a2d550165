from __future__ import annotations

from forge.core.request import Request
from forge.policies.base import Policy, split_decoding


class Sarathi(Policy):
    """Sarathi-Serve's stall-free batching (Agrawal et al., OSDI'24).

    Each step: every running decode first, then the ongoing partial prefills (oldest
    first), then new requests (FCFS); prefills are chunked to fill whatever is left of a
    per-step token budget of ``chunk_size`` tokens (the engine's
    ``max_num_batched_tokens`` when null). A small chunk bounds every iteration's cost, so
    time-between-tokens stays low while prompts still make progress. Needs
    ``engine.enable_chunked_prefill=true``. The latest arrival is preempted first.
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(self, chunk_size: int | None = None) -> None:
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"scheduler.chunk_size must be >= 1 (or null), got {chunk_size}")
        self.chunk_size = chunk_size

    def waiting_key(self, request: Request) -> tuple[float, str]:
        return (request.arrival_time, request.request_id)

    def running_order(self, running: list[Request]) -> list[Request]:
        decodes, prefills = split_decoding(running)
        return decodes + sorted(prefills, key=self.waiting_key) if prefills else running

    def token_budget(self, engine_budget: int) -> int:
        return engine_budget if self.chunk_size is None else min(self.chunk_size, engine_budget)
