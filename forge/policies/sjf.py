from __future__ import annotations

from forge.core.request import Request
from forge.policies.base import Policy


class SJF(Policy):
    """Shortest job first.

    By default the job length is the prompt length (known at arrival). With ``oracle: true``
    it is the true remaining output length, ``expected_output_len`` (as the workload knows
    it; ``max_tokens`` when unknown) minus the tokens already generated — an upper bound
    on what any real predictor achieves. Ties by arrival. The longest job is preempted first.
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(self, oracle: bool = False) -> None:
        self.oracle = oracle

    def job_length(self, request: Request) -> int:
        if not self.oracle:
            return request.num_prompt_tokens
        total = request.expected_output_len or request.sampling_params.max_tokens
        return max(total - request.num_output_tokens, 0)

    def waiting_key(self, request: Request) -> tuple[int, float, str]:
        return (self.job_length(request), request.arrival_time, request.request_id)
