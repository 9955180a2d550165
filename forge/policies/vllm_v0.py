from __future__ import annotations

from forge.core.request import Request
from forge.policies.base import Policy


class VllmV0(Policy):
    """vLLM V0's scheduler (as Vidur's ``vllm`` replica scheduler models it).

    Each step is prefill-only or decode-only: when waiting prompts fit (FCFS, whole prompts
    within the token budget and ``max_num_seqs``) the step runs just those prefills and every
    running decode stalls; otherwise it runs every running request's decode. A prompt is
    admitted only if ``watermark`` of the KV cache's blocks stay free after its blocks are
    allocated (vLLM's and Vidur's 1%), so running decodes have room to grow. Meant with
    ``engine.enable_chunked_prefill=false``. The latest arrival is preempted first.
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    waiting_first = True
    prefill_only_steps = True

    def __init__(self, watermark: float = 0.01) -> None:
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"scheduler.watermark must be in [0, 1), got {watermark}")
        self.admission_watermark = watermark

    def waiting_key(self, request: Request) -> tuple[float, str]:
        return (request.arrival_time, request.request_id)
