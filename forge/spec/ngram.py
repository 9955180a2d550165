"""Prompt-lookup (n-gram) drafting with an adaptive draft length per request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from forge.core.request import Request
from forge.spec.base import Draft, Drafter


def ngram_lookup(tokens: Sequence[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed an earlier occurrence of the longest suffix of ``tokens``
    of length n in [min_n, max_n] (longest first); [] when nothing matches.

    The most recent occurrence with ``k`` tokens after it wins; when every occurrence is too
    close to the end (a repeating run overlapping the suffix), the one with the longest
    continuation does, so a periodic tail still yields a full draft."""
    length = len(tokens)
    if k <= 0 or length < min_n + 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # Windows that end before the last token, so a continuation exists after them.
        windows = sliding_window_view(arr[: length - 1], n)
        hits = np.flatnonzero((windows == arr[length - n :]).all(axis=1))
        if hits.size:
            full = hits[hits + n + k <= length]
            start = int(full[-1] if full.size else hits[0]) + n
            return arr[start : start + k].tolist()
    return []


class NgramDrafter(Drafter):
    """Match the last n tokens (``prompt_lookup_min <= n <= prompt_lookup_max``) against the
    request's own prompt + output and propose what followed.

    Adaptive length (``adaptive=True``): each request starts at ``num_speculative_tokens``;
    a fully accepted draft doubles its length (up to ``num_speculative_tokens``), a
    rejection shrinks it to one more than the number accepted (at least ``min_speculative_tokens``).
    The per-request length is the only state, dropped by ``remove``.
    """

    def __init__(
        self,
        num_speculative_tokens: int = 5,
        prompt_lookup_min: int = 1,
        prompt_lookup_max: int = 4,
        adaptive: bool = True,
        min_speculative_tokens: int = 1,
    ) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"drafter.num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(
                "drafter needs 1 <= prompt_lookup_min <= prompt_lookup_max, "
                f"got {prompt_lookup_min}..{prompt_lookup_max}"
            )
        if not 1 <= min_speculative_tokens <= num_speculative_tokens:
            raise ValueError(
                f"drafter.min_speculative_tokens must be in [1, {num_speculative_tokens}], got {min_speculative_tokens}"
            )
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max
        self.adaptive = adaptive
        self.min_speculative_tokens = min_speculative_tokens
        self._length: dict[str, int] = {}

    def draft_length(self, request_id: str) -> int:
        """The request's current adaptive draft length."""
        return self._length.get(request_id, self.num_speculative_tokens)

    def propose(self, requests: Sequence[Request], limits: Mapping[str, int]) -> dict[str, Draft]:
        drafts: dict[str, Draft] = {}
        for request in requests:
            k = min(limits.get(request.request_id, 0), self.draft_length(request.request_id))
            tokens = ngram_lookup(request.all_token_ids, self.prompt_lookup_min, self.prompt_lookup_max, k)
            if tokens:
                drafts[request.request_id] = Draft(tokens)
        return drafts

    def observe(self, request_id: str, num_draft: int, num_accepted: int) -> None:
        if not self.adaptive or num_draft == 0:
            return
        k = self.draft_length(request_id)
        if num_accepted == num_draft:
            k = min(2 * k, self.num_speculative_tokens)
        else:
            k = max(num_accepted + 1, self.min_speculative_tokens)
        self._length[request_id] = k

    def remove(self, request_id: str) -> None:
        self._length.pop(request_id, None)

    def num_tracked(self) -> int:
        return len(self._length)
