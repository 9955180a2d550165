"""A progress bar over a run's requests (``forge run progress=true``): tqdm's, or one that shows nothing
without importing tqdm."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Protocol


class Progress(Protocol):
    def update(self, n: int) -> object: ...


class _NoBar:
    """A progress bar that shows nothing."""

    def update(self, n: int) -> None:
        pass


def progress_bar(total: int, enabled: bool) -> AbstractContextManager[Progress]:
    """A tqdm bar over ``total`` requests, or (tqdm not even imported) one that shows nothing."""
    if not enabled:
        return nullcontext(_NoBar())
    from tqdm import tqdm

    bar: AbstractContextManager[Progress] = tqdm(total=total, unit="req", desc="forge")
    return bar
