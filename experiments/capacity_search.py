"""Capacity searches for the cluster studies: many ``forge.capacity.search`` calls in parallel worker
processes, each flattened to a row (the answer, the probe just above it, GPUs, goodput per GPU).

Trace windows stand in for seeds: a trace's arrivals and lengths are fixed, so a seed moves nothing
but the synthetic prompts' token ids; three disjoint windows of the trace are three samples of its
traffic, and each configuration is reported as the mean ± 95% CI over them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pandas as pd

WINDOWS = ((0, 300), (1200, 1500), (2400, 2700))  # seconds of the trace: three disjoint 5-minute samples


Job = tuple[Sequence[str], float, float, float, dict[str, Any]]  # overrides, TTFT SLO, TPOT SLO, tolerance, tags


def one_search(
    overrides: Sequence[str], ttft_s: float, tpot_s: float, tol: float, tags: dict[str, Any]
) -> dict[str, Any]:
    import torch

    from forge.capacity.search import SLO, search

    torch.set_num_threads(1)
    t0 = time.process_time()
    result = search(list(overrides), SLO(ttft_s, tpot_s, 0.9), tol=tol)
    return {
        **tags,
        "ttft_slo_s": ttft_s,
        "tpot_slo_s": tpot_s,
        "rate": result.rate,
        "missed_at": result.above.rate if result.above else float("nan"),
        "attainment_at_rate": result.below.attainment if result.below else float("nan"),
        "gpus": result.gpus,
        "goodput_per_gpu": result.goodput_per_gpu,
        "probes": len(result.probes),
        "monotone": result.monotone,
        "num_requests": result.below.num_requests if result.below else 0,
        "cpu_s": time.process_time() - t0,
    }


def run_searches(jobs: Sequence[Job], n_jobs: int = 2) -> pd.DataFrame:
    """Each job's capacity row (in parallel worker processes)."""
    t0 = time.perf_counter()
    try:
        from joblib import Parallel, delayed

        rows = Parallel(n_jobs=n_jobs, backend="loky")(delayed(one_search)(*job) for job in jobs)
    except ImportError:
        rows = [one_search(*job) for job in jobs]
    print(f"{len(jobs)} capacity searches in {time.perf_counter() - t0:.0f} s")
    return pd.DataFrame(rows)


def window_overrides(window: tuple[int, int]) -> list[str]:
    return [f"workload.window_s=[{window[0]},{window[1]}]"]
