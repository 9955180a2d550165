from __future__ import annotations

from forge.core.request import Request
from forge.policies.base import Policy, split_decoding


class DecodeFirst(Policy):
    """Decode-prioritizing: every running decode gets its token before any prefill work.

    Running requests that have finished their prompt go first, then running partial
    prefills, then new requests (FCFS) take what budget is left. Decodes never stall
    behind a long prompt; new requests wait longer when the batch is busy. The latest
    arrival is preempted first.
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def waiting_key(self, request: Request) -> tuple[float, str]:
        return (request.arrival_time, request.request_id)

    def running_order(self, running: list[Request]) -> list[Request]:
        decodes, prefills = split_decoding(running)
        return decodes + prefills if prefills else running
