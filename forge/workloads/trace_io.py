"""Reading request traces: CSV or JSONL, optionally gzip-compressed, with a column mapping.

A trace row becomes a :class:`TraceRow` (arrival in seconds from the trace's first row, prompt and
output lengths, optional text prompt, priority, request id and shared-prefix key). Every error names
the file and the line it comes from (a CSV's header is line 1).

``path`` may name a file shipped with forge as ``package:<name>`` (``forge/workloads/data/<name>``),
e.g. ``package:azure/AzureLLMInferenceTrace_conv.csv.gz``."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

PACKAGE_PREFIX = "package:"
DATA_DIR = Path(__file__).resolve().parent / "data"
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# forge's own column names: what a trace uses when ``columns`` maps nothing
DEFAULT_COLUMNS = {
    "arrival": "arrival_time",
    "input_len": "input_len",
    "output_len": "output_len",
    "prompt": "prompt",
    "priority": "priority",
    "request_id": "request_id",
    "prefix_hash": "prefix_hash",
    "prefix_len": "prefix_len",
}


@dataclass(frozen=True)
class TraceRow:
    line: int
    arrival_s: float  # seconds from the trace's first row (datetimes) or as written (numbers × unit)
    output_len: int
    input_len: int | None
    prompt: str | None
    priority: int
    request_id: str | None
    prefix_key: str | None
    prefix_len: int | None


def resolve_path(path: str) -> Path:
    """``package:<name>`` → the file shipped in ``forge/workloads/data``; anything else as given."""
    if path.startswith(PACKAGE_PREFIX):
        return DATA_DIR / path.removeprefix(PACKAGE_PREFIX)
    return Path(path)


def column_map(columns: Mapping[str, Any] | None) -> dict[str, str]:
    """forge's field → the trace's column name; unknown fields are refused."""
    out = dict(DEFAULT_COLUMNS)
    for key, name in (columns or {}).items():
        if key not in DEFAULT_COLUMNS:
            raise ValueError(f"workload.columns.{key}: unknown field (one of {', '.join(DEFAULT_COLUMNS)})")
        out[str(key)] = str(name)
    return out


def raw_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) for each record of a .csv / .jsonl / .json file, gzip-compressed or not."""
    if not path.is_file():
        raise FileNotFoundError(f"workload.path: trace file {str(path)!r} not found")
    name = path.name.removesuffix(".gz")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        if name.endswith(".csv"):
            reader = csv.DictReader(text)
            for row in reader:
                yield reader.line_num, row
        elif name.endswith((".jsonl", ".json")):
            yield from _json_lines(text, path)
        else:
            raise ValueError(f"workload.path: unknown trace format {path.name!r} (use .csv or .jsonl, optionally .gz)")


def _json_lines(text: io.TextIOWrapper, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, line in enumerate(text, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {n}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {n}: a JSON object per line expected")
        yield n, row


def read_rows(path: Path, columns: Mapping[str, str], time_unit: str = "s") -> list[TraceRow]:
    """Every row parsed; arrivals given as datetimes are made relative to the first row's."""
    if time_unit not in TIME_UNITS:
        raise ValueError(f"workload.time_unit must be one of {', '.join(TIME_UNITS)}, got {time_unit!r}")
    rows: list[TraceRow] = []
    origin: datetime | None = None
    for line, raw in raw_rows(path):
        where = f"{path} line {line}"
        stamp = _field(raw, columns["arrival"], where, required=True)
        arrival, when = _arrival(stamp, where, TIME_UNITS[time_unit])
        if when is not None:
            origin = origin or when
            arrival = (when - origin).total_seconds()
        elif origin is not None:
            raise ValueError(f"{where}: {columns['arrival']} is a number but earlier rows are datetimes")
        rows.append(_row(raw, columns, where, line, arrival))
    return rows


def _row(raw: Mapping[str, Any], columns: Mapping[str, str], where: str, line: int, arrival: float) -> TraceRow:
    input_len = _int(raw, columns["input_len"], where)
    prompt = _field(raw, columns["prompt"], where)
    if input_len is None and not prompt:
        raise ValueError(f"{where}: needs {columns['input_len']} or {columns['prompt']}")
    output_len = _int(raw, columns["output_len"], where, required=True)
    assert output_len is not None
    if output_len < 1 or (input_len is not None and input_len < 1):
        raise ValueError(f"{where}: {columns['input_len']} and {columns['output_len']} must be >= 1")
    key = _field(raw, columns["prefix_hash"], where)
    rid = _field(raw, columns["request_id"], where)
    return TraceRow(
        line=line,
        arrival_s=arrival,
        output_len=output_len,
        input_len=input_len,
        prompt=str(prompt) if prompt else None,
        priority=_int(raw, columns["priority"], where) or 0,
        request_id=str(rid) if rid else None,
        prefix_key=str(key) if key else None,
        prefix_len=_int(raw, columns["prefix_len"], where),
    )


def _field(raw: Mapping[str, Any], name: str, where: str, required: bool = False) -> Any:
    value = raw.get(name)
    if value in (None, "") and required:
        raise ValueError(f"{where}: missing column {name!r}")
    return None if value == "" else value


def _int(raw: Mapping[str, Any], name: str, where: str, required: bool = False) -> int | None:
    value = _field(raw, name, where, required)
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be a number, got {value!r}") from None
    if not number.is_integer():
        raise ValueError(f"{where}: {name} must be a whole number, got {value!r}")
    return int(number)


def _arrival(value: Any, where: str, unit: float) -> tuple[float, datetime | None]:
    """(seconds, None) for a number; (0, the datetime) for a timestamp string."""
    try:
        seconds = float(value) * unit
    except (TypeError, ValueError):
        return 0.0, _datetime(str(value), where)
    if not math.isfinite(seconds):
        raise ValueError(f"{where}: arrival {value!r} is not finite")
    return seconds, None


def _datetime(text: str, where: str) -> datetime:
    """ISO 8601 (``2023-11-16 18:15:46.6805900``: fractions past microseconds are cut, as Python's parser wants)."""
    head, dot, frac = text.strip().partition(".")
    digits = "".join(c for c in frac if c.isdigit())
    rest = frac[len(digits) :]
    try:
        return datetime.fromisoformat(head + (dot + digits[:6] + rest if dot else ""))
    except ValueError:
        raise ValueError(f"{where}: arrival {text!r} is neither seconds nor an ISO datetime") from None
