"""The steps a ``MetricsRecorder`` records, kept column-wise: one int64 or float64 array per field of
``StepRecord`` (8 bytes a value, where a named tuple a step and its Python numbers took ~400 bytes), so
a million-request run's steps fit in a few hundred megabytes and become a frame without a copy per row."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple, overload

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


class StepRecord(NamedTuple):
    """One step's statistics, as ``StepLog`` gives a step back."""

    step: int
    start_time: float
    end_time: float
    num_seqs: int
    num_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_waiting: int
    num_running: int
    num_preempted: int
    kv_usage: float
    kv_token_slots: int
    kv_reserved_slots: int
    kv_internal_frag_slots: int
    kv_external_frag_slots: int
    kv_free_slots: int
    kv_total_slots: int


FLOAT_FIELDS = frozenset({"start_time", "end_time", "kv_usage"})
TYPECODES = tuple("d" if name in FLOAT_FIELDS else "q" for name in StepRecord._fields)
_PENDING = 1024  # steps held as tuples before they go into the columns


class StepLog(Sequence[StepRecord]):
    """The recorded steps, in order, a ``Sequence`` of ``StepRecord``: ``append`` takes one step's values
    as a plain tuple in ``StepRecord``'s field order (cheaper than building the named tuple); they are
    moved into the columns in batches. ``column(name)`` is one field as a numpy array; ``frame()`` all
    of them as ``steps.parquet``'s frame (int64 and float64 columns, as the named tuples inferred)."""

    __slots__ = ("_columns", "_pending")

    def __init__(self) -> None:
        self._columns = [array(code) for code in TYPECODES]
        self._pending: list[tuple[int | float, ...]] = []

    def append(self, values: tuple[int | float, ...]) -> None:
        pending = self._pending
        pending.append(values)
        if len(pending) >= _PENDING:
            self._flush()

    def extend(self, steps: Iterable[tuple[int | float, ...]]) -> None:
        for values in steps:
            self.append(values)

    def _flush(self) -> None:
        if self._pending:
            for column, values in zip(self._columns, zip(*self._pending, strict=True), strict=True):
                column.extend(values)
            self._pending = []

    def __len__(self) -> int:
        return len(self._columns[0]) + len(self._pending)

    @overload
    def __getitem__(self, index: int) -> StepRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepRecord]: ...

    def __getitem__(self, index: int | slice) -> StepRecord | list[StepRecord]:
        self._flush()
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        return StepRecord(*(column[index] for column in self._columns))

    def __delitem__(self, index: slice) -> None:
        """Drop a slice of the steps (a server keeps only its latest ones)."""
        self._flush()
        for column in self._columns:
            del column[index]

    def __iter__(self) -> Iterator[StepRecord]:
        self._flush()
        return map(StepRecord._make, zip(*self._columns, strict=True))

    def column(self, name: str) -> np.ndarray:
        """Field ``name`` of every step, as a numpy array (a copy)."""
        self._flush()
        column = self._columns[StepRecord._fields.index(name)]
        return np.frombuffer(column, dtype=np.float64 if column.typecode == "d" else np.int64).copy()

    def frame(self) -> pd.DataFrame:
        """One row per step, one column per field (an empty frame with no columns when there are none)."""
        import pandas as pd

        if not len(self):
            return pd.DataFrame([])
        return pd.DataFrame({name: self.column(name) for name in StepRecord._fields}, copy=False)
