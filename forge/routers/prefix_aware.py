"""Cache-aware routing as SGLang's router does it (sgl-router's ``cache_aware`` policy, documented at
https://docs.sglang.ai/advanced_features/router.html): while the load is balanced, the replica whose
prefix cache holds the longest prefix of the prompt, if that covers at least ``cache_threshold`` of
it, else the replica with the most free KV; when the load is imbalanced, the least loaded replica.

Load is the number of unfinished requests on a replica; the load is imbalanced when
``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold * min`` (SGLang's two
thresholds and their defaults: 32 and 1.0001; its cache threshold defaults to 0.5). SGLang matches
against an approximate radix tree of the text it routed to each worker; here the match is the
replica's own prefix cache (``ReplicaView.prefix_match``), so it needs ``kvcache.enable_prefix_caching``."""

from __future__ import annotations

from collections.abc import Sequence

from forge.core.request import Request
from forge.routers.base import ReplicaView, Router, least


class PrefixAware(Router):
    """Longest cached prefix while balanced, least loaded when not (see the module's docstring)."""

    def __init__(
        self, cache_threshold: float = 0.5, balance_abs_threshold: int = 32, balance_rel_threshold: float = 1.0001
    ) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"router.cache_threshold must be in [0, 1], got {cache_threshold}")
        if balance_abs_threshold < 0 or balance_rel_threshold < 1.0:
            raise ValueError("router.balance_abs_threshold must be >= 0 and router.balance_rel_threshold >= 1")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        loads = [r.num_outstanding for r in replicas]
        high, low = max(loads), min(loads)
        if high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low:
            return least(replicas, "num_outstanding")
        match, best = max((r.prefix_match(request), -r.index) for r in replicas)
        if match > 0 and match >= self.cache_threshold * request.num_prompt_tokens:
            return -best
        return least(replicas, "kv_usage")
