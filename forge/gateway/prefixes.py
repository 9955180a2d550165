"""The gateway's record of which prompt prefixes it sent to a backend (SGLang's router keeps an
approximate tree of the text it routed per worker; this keeps hashes of prefix blocks)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK = 16  # routing tokens per hashed block (a routing token is a byte of the prompt's text)


def block_hashes(tokens: Sequence[int], block: int = BLOCK) -> list[int]:
    """The chained hash of each whole block of ``tokens``: block i's hash covers tokens [0, (i + 1) × block)."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block + 1, block):
        parent = hash((parent, tuple(tokens[start : start + block])))
        out.append(parent)
    return out


class PrefixRecord:
    """Prefix blocks sent to one backend, least recently used dropped beyond ``capacity`` blocks."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def add(self, tokens: Sequence[int]) -> None:
        for h in block_hashes(tokens):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def match(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens``' prefix covered by blocks this backend was sent (whole blocks)."""
        matched = 0
        for h in block_hashes(tokens):
            if h not in self._blocks:
                break
            matched += BLOCK
        return matched
