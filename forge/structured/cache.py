"""Compiled grammars kept per spec, bounded in bytes (least recently used dropped first)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar


class Sized(Protocol):
    @property
    def nbytes(self) -> int:
        """An estimate of the memory the object holds (it may grow while it is used)."""


K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Sized)


class ByteBoundedCache(Generic[K, V]):
    """An LRU cache whose entries' ``nbytes`` sum to at most ``max_bytes`` after every ``put``.

    Sizes are re-read at each ``put`` because a grammar's mask cache grows as it is used. An
    entry larger than the whole budget is not kept (and evicts nothing). Safe to use from several threads."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        if value.nbytes > self.max_bytes:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            total = sum(v.nbytes for v in self._entries.values())
            while self._entries and total > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                total -= dropped.nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(v.nbytes for v in self._entries.values())
