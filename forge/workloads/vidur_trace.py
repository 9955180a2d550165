"""Replay of a Vidur trace CSV (``workload=vidur_trace``): the requests Vidur's
``TraceReplayRequestGenerator`` makes of the same file and settings (microsoft/vidur,
vidur/request_generator/trace_replay_request_generator.py), e.g. its ``data/processed_traces/*.csv``.

The file needs Vidur's columns ``arrived_at`` (s), ``num_prefill_tokens`` and ``num_decode_tokens``
(others are ignored). As Vidur does: the token counts are multiplied by ``prefill_scale_factor`` /
``decode_scale_factor`` and truncated to ints, raised to at least 1, and a request longer than
``max_tokens`` in all loses prompt tokens to fit; arrival times are multiplied by ``time_scale_factor``.
Requests keep the file's order (Vidur's simulator orders them by arrival)."""

from __future__ import annotations

import random
from pathlib import Path

from forge.tokenizers.base import Tokenizer
from forge.workloads.synthetic import RequestSpec, Workload, check_prompt_len

COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


class VidurTraceWorkload(Workload):
    def __init__(
        self,
        path: str,
        prefill_scale_factor: float = 1.0,
        decode_scale_factor: float = 1.0,
        time_scale_factor: float = 1.0,
        max_tokens: int = 4096,
        seed: int = 0,
        ignore_eos: bool = True,
    ) -> None:
        for name, value in (
            ("prefill_scale_factor", prefill_scale_factor),
            ("decode_scale_factor", decode_scale_factor),
            ("time_scale_factor", time_scale_factor),
        ):
            if not value > 0:
                raise ValueError(f"workload.{name} must be > 0, got {value}")
        if max_tokens < 2:
            raise ValueError(f"workload.max_tokens must be >= 2 (one prompt and one output token), got {max_tokens}")
        self.path, self.max_tokens, self.seed, self.ignore_eos = path, max_tokens, seed, ignore_eos
        self.scales = (prefill_scale_factor, decode_scale_factor, time_scale_factor)

    def rows(self) -> list[tuple[float, int, int]]:
        """(arrival s, prompt tokens, output tokens) per request, as Vidur computes them."""
        import pandas as pd

        path = Path(self.path)
        if not path.is_file():
            raise FileNotFoundError(f"workload.path: Vidur trace {self.path!r} not found")
        df = pd.read_csv(path)
        missing = [c for c in COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(
                f"workload.path: {self.path} is not a Vidur trace: missing columns {missing} (needs {list(COLUMNS)})"
            )
        prefill_scale, decode_scale, time_scale = self.scales
        prefill = (df["num_prefill_tokens"] * prefill_scale).astype(int).clip(lower=1)
        decode = (df["num_decode_tokens"] * decode_scale).astype(int).clip(lower=1)
        prefill = prefill - (prefill + decode - self.max_tokens).clip(lower=0)
        arrived = df["arrived_at"] * time_scale
        return list(zip(arrived.tolist(), prefill.tolist(), decode.tolist(), strict=True))

    def requests(self, tokenizer: Tokenizer, max_prompt_len: int | None = None) -> list[RequestSpec]:
        rows = self.rows()
        for i, (arrival, prompt, output) in enumerate(rows):
            where = f"workload.path: {self.path} row {i + 1}"
            if prompt < 1:
                raise ValueError(f"{where}: {output} output tokens leave no prompt within max_tokens={self.max_tokens}")
            if arrival < 0:
                raise ValueError(f"{where}: negative arrived_at {arrival}")
            check_prompt_len(f"req-{i:06d}", prompt, max_prompt_len)
        prompts = tokenizer.random_token_id_lists([p for _, p, _ in rows], random.Random(self.seed))
        return [
            RequestSpec(request_id=f"req-{i:06d}", arrival_time=t, prompt_token_ids=prompts[i], output_len=out)
            for i, (t, _, out) in enumerate(rows)
        ]
