"""Replay of a request trace file: forge's own columns, a public production trace or your own logs.

Format: CSV with a header row, or JSONL (one object per line), chosen by the file suffix
(``.csv``, ``.jsonl`` / ``.json``, each optionally ``.gz``). Fields per request, by forge's names
(``columns`` maps them onto a trace's own, e.g. ``{arrival: TIMESTAMP, input_len: ContextTokens,
output_len: GeneratedTokens}`` for Microsoft's Azure LLM inference traces):

- ``arrival`` (``arrival_time``): seconds from the start of the trace (× ``time_unit``), or a datetime
  (ISO 8601), made relative to the first row; rows must be in arrival order unless ``unsorted=sort``,
- ``output_len`` (tokens to generate),
- ``input_len`` (prompt tokens; seeded random tokens are generated) and/or ``prompt`` (text,
  tokenised with the running model's tokenizer; when both are given the prompt wins),
- optional ``priority`` (int, default 0), ``request_id``, and ``prefix_hash`` (rows with the same
  value share their first ``prefix_len`` prompt tokens, default the whole shorter prompt: the
  shared-prefix key of cache-aware studies).

``time_scale`` multiplies arrival times (0.5 = twice the rate); ``window_s`` = [start, end] keeps the
rows arriving in that span of the trace (then start is time 0); ``max_requests`` keeps the first
ones; ``too_long`` = ``error`` | ``skip`` for prompts the engine cannot take (skipped rows are
counted in the log)."""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

from forge.tokenizers.base import Tokenizer
from forge.workloads.synthetic import RequestSpec, Workload, check_prompt_len
from forge.workloads.trace_io import TraceRow, column_map, read_rows, resolve_path

log = logging.getLogger("forge.workload")
UNSORTED = ("error", "sort")
TOO_LONG = ("error", "skip")


class TraceWorkload(Workload):
    """Requests replayed from ``path`` (see the module docstring for the fields and settings)."""

    def __init__(
        self,
        path: str,
        seed: int = 0,
        time_scale: float = 1.0,
        max_requests: int | None = None,
        ignore_eos: bool = True,
        columns: Mapping[str, Any] | None = None,
        time_unit: str = "s",
        window_s: Sequence[float] | None = None,
        unsorted: str = "error",
        too_long: str = "error",
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"workload.time_scale must be > 0, got {time_scale}")
        if max_requests is not None and max_requests < 1:
            raise ValueError(f"workload.max_requests must be >= 1 or null, got {max_requests}")
        _one_of("unsorted", unsorted, UNSORTED)
        _one_of("too_long", too_long, TOO_LONG)
        self.window = _window(window_s)
        self.path = path
        self.seed = seed
        self.time_scale = time_scale
        self.max_requests = max_requests
        self.ignore_eos = ignore_eos
        self.columns = column_map(columns)
        self.time_unit = time_unit
        self.unsorted = unsorted
        self.too_long = too_long

    def rows(self) -> list[TraceRow]:
        """The trace's rows in arrival order, inside the window, at most ``max_requests`` of them."""
        path = resolve_path(self.path)
        rows = read_rows(path, self.columns, self.time_unit)
        for prev, row in itertools.pairwise(rows):
            if row.arrival_s < prev.arrival_s and self.unsorted == "error":
                raise ValueError(
                    f"{path} line {row.line}: arrival goes back in time ({row.arrival_s:g} s after "
                    f"{prev.arrival_s:g} s on line {prev.line}); sort the trace or set workload.unsorted=sort"
                )
        if rows and min(r.arrival_s for r in rows) < 0:
            bad = min(rows, key=lambda r: r.arrival_s)
            raise ValueError(f"{path} line {bad.line}: negative arrival time {bad.arrival_s:g} s")
        rows = sorted(rows, key=lambda r: r.arrival_s)
        if self.window is not None:
            start, end = self.window
            rows = [r for r in rows if start <= r.arrival_s <= end]
        return rows

    def requests(self, tokenizer: Tokenizer, max_prompt_len: int | None = None) -> list[RequestSpec]:
        rows = self.rows()
        start = self.window[0] if self.window is not None else 0.0
        rng = random.Random(self.seed)
        prefixes: dict[str, list[int]] = {}
        specs: list[RequestSpec] = []
        skipped = 0
        for n, row in enumerate(rows):
            if self.max_requests is not None and len(specs) == self.max_requests:
                break
            rid = row.request_id or f"req-{n:06d}"
            length = row.input_len if not row.prompt else len(tokenizer.encode(row.prompt))
            assert length is not None
            if max_prompt_len is not None and length > max_prompt_len and self.too_long == "skip":
                skipped += 1
                continue
            check_prompt_len(f"{self.path} line {row.line} ({rid})", length, max_prompt_len)
            ids = self._prompt(row, tokenizer, rng, prefixes)
            arrival = (row.arrival_s - start) * self.time_scale
            specs.append(RequestSpec(rid, arrival, ids, row.output_len, row.priority))
        if skipped:
            log.warning(
                "workload: skipped %d trace rows whose prompt is longer than %s tokens", skipped, max_prompt_len
            )
        return specs

    def _prompt(
        self, row: TraceRow, tokenizer: Tokenizer, rng: random.Random, prefixes: dict[str, list[int]]
    ) -> list[int]:
        if row.prompt:
            return tokenizer.encode(row.prompt)
        assert row.input_len is not None
        if row.prefix_key is None:
            return tokenizer.random_token_ids(row.input_len, rng)
        shared = row.input_len if row.prefix_len is None else min(row.prefix_len, row.input_len)
        prefix = prefixes.get(row.prefix_key)
        if prefix is None or len(prefix) < shared:  # drawn from the key alone: the same tokens wherever it appears
            prefix = tokenizer.random_token_ids(
                max(shared, len(prefix or [])), random.Random(f"{self.seed}:{row.prefix_key}")
            )
            prefixes[row.prefix_key] = prefix
        return prefix[:shared] + tokenizer.random_token_ids(row.input_len - shared, rng)


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"workload.{name} must be one of {', '.join(allowed)}, got {value!r}")


def _window(window_s: Sequence[float] | None) -> tuple[float, float] | None:
    if window_s is None:
        return None
    if len(window_s) != 2 or not 0 <= float(window_s[0]) < float(window_s[1]):
        raise ValueError(f"workload.window_s must be [start, end] with 0 <= start < end (s), got {list(window_s)}")
    return float(window_s[0]), float(window_s[1])
