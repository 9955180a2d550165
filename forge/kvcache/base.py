"""The KV cache manager contract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from forge.request import Request


@dataclass(frozen=True)
class KVUsage:
    """Slot accounting at one instant (vLLM paper, Fig. 2 categories), in token slots.

    ``token_slots`` hold computed KV; ``reserved_slots`` are held for tokens the request
    will still produce; ``internal_frag_slots`` are held but will never be used;
    ``external_frag_slots`` are free but outside the largest free run, so unusable for a
    large contiguous allocation; ``free_slots`` counts all free slots (external included).
    """

    total_slots: int
    token_slots: int
    reserved_slots: int
    internal_frag_slots: int
    external_frag_slots: int
    free_slots: int

    @property
    def used_fraction(self) -> float:
        return 1.0 - self.free_slots / self.total_slots if self.total_slots else 0.0


class KVCacheManager(ABC):
    """Maps each request to a block table over a pool of ``num_blocks`` x ``block_size`` slots.

    - ``match_prefix(req)`` (fresh requests only) acquires cached blocks for a prefix of
      the prompt and returns how many tokens they hold (a multiple of ``block_size``, less
      than ``req.num_tokens``); managers without prefix caching return 0.
    - ``allocate_slots(req, num_tokens, num_cacheable)`` makes the table cover the first
      ``num_tokens`` positions, all-or-nothing; False if the pool cannot. The first
      ``num_cacheable`` tokens are final (no drafts) and may be shared by prefix caching.
    - ``trim(req, num_tokens)`` gives back blocks past ``num_tokens`` (rejected drafts).
    - ``free(req)`` releases everything the request holds; unknown ids are a no-op.
    """

    num_blocks: int
    block_size: int

    @abstractmethod
    def match_prefix(self, request: Request) -> int: ...

    @abstractmethod
    def allocate_slots(self, request: Request, num_tokens: int, num_cacheable: int) -> bool: ...

    @abstractmethod
    def trim(self, request: Request, num_tokens: int) -> None: ...

    @abstractmethod
    def free(self, request: Request) -> None: ...

    @abstractmethod
    def block_table(self, request_id: str) -> list[int]: ...

    @abstractmethod
    def num_free_blocks(self) -> int: ...

    @abstractmethod
    def usage(self, requests: list[Request]) -> KVUsage:
        """Accounting over the given live requests (those holding slots)."""

    @property
    def usage_fraction(self) -> float:
        return 1.0 - self.num_free_blocks() / self.num_blocks

    def num_held(self) -> int:
        """Requests currently holding blocks (the engine checks it drops to 0)."""
        return 0

    def stats(self) -> dict[str, int]:
        """Counters such as prefix-cache queries and hits."""
        return {}
