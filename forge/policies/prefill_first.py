from __future__ import annotations

from forge.core.request import Request
from forge.policies.base import Policy, split_decoding


class PrefillFirst(Policy):
    """Prefill-prioritizing (vLLM V0 / Orca style): waiting prompts take the token budget
    first, then running partial prefills, and running decodes get what is left — so decodes
    stall while long prompts are processed (the "generation stalls" of Sarathi-Serve).
    FCFS among waiting requests; the latest arrival is preempted first.
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    waiting_first = True

    def waiting_key(self, request: Request) -> tuple[float, str]:
        return (request.arrival_time, request.request_id)

    def running_order(self, running: list[Request]) -> list[Request]:
        decodes, prefills = split_decoding(running)
        return prefills + decodes if prefills else running
