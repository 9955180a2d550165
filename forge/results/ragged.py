"""Ragged float columns (each request's inter-token latencies) kept as one flat float64 array and
cut into views of it, so that a million requests' ITLs are built, joined and written without a
Python number per value or a pass over them an array at a time."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

_DTYPE = attrgetter("dtype")
_FLOAT64 = np.dtype(np.float64)


def inner_gaps(times: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
    """The gaps between consecutive values within each run of ``times`` (runs of ``lens[i]`` values,
    one after another: each request's token times, so its ITLs), as views of one new float64 array;
    a run of fewer than two values has none (an empty view)."""
    gaps = np.diff(times)  # gaps[i] = times[i + 1] - times[i]
    keep = np.ones(len(gaps), dtype=bool)
    keep[np.cumsum(lens)[lens > 0][:-1] - 1] = False  # a run's last value to the next run's first
    values = gaps[keep]
    cuts = [0, *np.cumsum(np.maximum(lens - 1, 0)).tolist()]
    return [values[a:b] for a, b in itertools.pairwise(cuts)]


def joined(parts: Sequence[Any]) -> np.ndarray:
    """``parts`` (arrays or sequences of numbers) one after another, as one new float64 array."""
    return np.concatenate(parts, dtype=float) if len(parts) else np.empty(0)


def float_lists(parts: Sequence[Any]) -> pa.ListArray | None:
    """``parts`` as an arrow list<double> array built from their joined values and offsets (what
    pyarrow makes of a column of them, without converting them one at a time); None unless every part
    is a float64 numpy array."""
    import pyarrow as pa

    if set(map(type, parts)) - {np.ndarray} or set(map(_DTYPE, parts)) - {_FLOAT64}:
        return None
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)), out=offsets[1:])
    values = joined(parts)
    if len(values) > np.iinfo(np.int32).max:  # list<double> has int32 offsets
        return None
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))


def write_parquet(frame: pd.DataFrame, path: Path, lists: Sequence[str] = ("itl",)) -> None:
    """``frame.to_parquet(path)``: the same table, schema and pandas metadata, with the columns named
    in ``lists`` that hold float64 arrays converted as ``float_lists`` (the other columns by pandas)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays = {name: float_lists(frame[name].tolist()) for name in lists if name in frame.columns}
    fast = {name: array for name, array in arrays.items() if array is not None}
    if not fast or frame.attrs:  # (pandas writes a frame's attrs into the metadata too)
        frame.to_parquet(path)
        return
    table = pa.Table.from_pandas(frame.drop(columns=list(fast)))
    meta = json.loads(table.schema.metadata[b"pandas"])
    for at, name in enumerate(frame.columns):  # each at its place in the frame, left to right
        if name in fast:
            table = table.add_column(at, name, fast[name])
            entry = {"name": name, "field_name": name, "pandas_type": "list[float64]", "numpy_type": "object"}
            meta["columns"].insert(at, {**entry, "metadata": None})
    metadata = {**table.schema.metadata, b"pandas": json.dumps(meta).encode()}
    pq.write_table(table.replace_schema_metadata(metadata), path)
