"""Speculative decoding study (``study.py``: the runs; ``make_report.py``: the report).

``run`` is what ``python -m experiments.run speculative [--size tiny]`` calls: the simulated synthetic
section (Llama-3-8B dims on an H100, no drafter vs ngram across batch sizes) over ``experiments.seeds.SEEDS``
into ``<out>/synthetic_simulated_per_seed.csv``, then the report from every CSV in ``out``. The real-model
sections are their own commands (see ``study.py``): they compute every token of SmolLM2 on the CPU.
"""

from __future__ import annotations

from pathlib import Path

SIZES = {
    "small": ["--max-tokens", "256", "--batches", "1,8,32,128,256"],
    "tiny": ["--max-tokens", "32", "--batches", "1,4"],
}


def run(out: Path, size: str) -> None:
    from experiments.speculative import make_report, study

    out.mkdir(parents=True, exist_ok=True)
    argv = ["--model", "synthetic", "--clock", "simulated", *SIZES[size]]
    command = "python -m experiments.run speculative" + ("" if size == "small" else f" --size {size}")
    study.main([*argv, "--out", str(out / "synthetic_simulated_per_seed.csv")], command=command)
    make_report.main(["--dir", str(out)])
