"""Replay of a request trace file.

Format: CSV with a header row, or JSONL (one object per line), chosen by the file suffix
(``.csv``, ``.jsonl`` / ``.json``). Fields per request:

- ``arrival_time`` (seconds from the start of the trace; need not be sorted),
- ``output_len`` (tokens to generate),
- ``input_len`` (prompt tokens; seeded random tokens are generated) and/or ``prompt`` (text,
  tokenised with the running model's tokenizer; when both are given the prompt wins),
- optional ``priority`` (int, default 0) and ``request_id``.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

from forge.tokenizers.base import Tokenizer
from forge.workloads.synthetic import RequestSpec, Workload, check_prompt_len


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"workload.path: trace file {str(path)!r} not found")
    text = path.read_text()
    if path.suffix == ".csv":
        return list(csv.DictReader(text.splitlines()))
    if path.suffix in (".jsonl", ".json"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    raise ValueError(f"workload.path: unknown trace format {path.suffix!r} (use .csv or .jsonl)")


class TraceWorkload(Workload):
    """Requests replayed from ``path``; ``time_scale`` multiplies arrival times (0.5 = twice the
    rate), ``max_requests`` keeps the first arrivals only."""

    def __init__(
        self,
        path: str,
        seed: int = 0,
        time_scale: float = 1.0,
        max_requests: int | None = None,
        ignore_eos: bool = True,
    ) -> None:
        if time_scale < 0:
            raise ValueError(f"workload.time_scale must be >= 0, got {time_scale}")
        self.path = path
        self.seed = seed
        self.time_scale = time_scale
        self.max_requests = max_requests
        self.ignore_eos = ignore_eos

    def requests(self, tokenizer: Tokenizer, max_prompt_len: int | None = None) -> list[RequestSpec]:
        rows = read_trace(self.path)
        rng = random.Random(self.seed)
        specs = []
        for n, row in enumerate(rows):
            where = f"{self.path} row {n + 1}"
            try:
                arrival = float(row["arrival_time"]) * self.time_scale
                output_len = int(row["output_len"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{where}: needs numeric arrival_time and output_len ({e})") from None
            prompt = row.get("prompt")
            rid = str(row.get("request_id") or f"req-{n:06d}")
            if prompt:
                ids = tokenizer.encode(str(prompt))
                check_prompt_len(f"{where} ({rid})", len(ids), max_prompt_len)
            elif row.get("input_len") not in (None, ""):
                check_prompt_len(f"{where} ({rid})", int(row["input_len"]), max_prompt_len)
                ids = tokenizer.random_token_ids(int(row["input_len"]), rng)
            else:
                raise ValueError(f"{where}: needs input_len or prompt")
            if not ids or output_len < 1 or arrival < 0:
                raise ValueError(f"{where}: empty prompt, output_len < 1 or negative arrival_time")
            specs.append(
                RequestSpec(
                    request_id=rid,
                    arrival_time=arrival,
                    prompt_token_ids=ids,
                    output_len=output_len,
                    priority=int(row.get("priority") or 0),
                )
            )
        specs.sort(key=lambda s: s.arrival_time)
        return specs[: self.max_requests] if self.max_requests is not None else specs
