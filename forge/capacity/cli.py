"""``forge capacity [overrides ...] --ttft S --tpot S [--config "OVERRIDES" ...]``: the highest request rate
each configuration serves within an SLO (``forge.capacity``), written as a report.

    forge capacity model=synthetic clock=simulated clock.hardware=a100 workload=azure_conv \\
        --ttft 2 --tpot 0.2 --config "scheduler=fcfs" --config "scheduler=sjf"

Overrides before the options apply to every configuration; each ``--config`` adds one configuration
(its own overrides, space-separated; none: the common overrides alone). Output: ``capacity.csv``,
``probes.csv``, ``attainment.png`` and ``report.md`` in ``--output-dir`` (default
``outputs/capacity/<date>/<time>``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from forge.config import ConfigError


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="forge capacity", description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides common to every configuration")
    ap.add_argument("--config", action="append", default=[], help="one configuration's own overrides (repeatable)")
    ap.add_argument("--ttft", type=float, required=True, help="TTFT SLO, seconds")
    ap.add_argument("--tpot", type=float, required=True, help="TPOT SLO, seconds")
    ap.add_argument("--attainment", type=float, default=0.9, help="fraction of requests within the SLO (0.9)")
    ap.add_argument("--tol", type=float, default=0.02, help="relative width of the final bracket (0.02)")
    ap.add_argument("--start-rate", type=float, default=None, help="first rate tried (default: the workload's)")
    ap.add_argument("--output-dir", default=None, help="default outputs/capacity/<date>/<time>")
    return ap


def main(argv: Sequence[str]) -> None:
    args = parser().parse_args(list(argv))
    from forge.capacity.report import write_capacity
    from forge.capacity.search import SLO, search

    slo = SLO(args.ttft, args.tpot, args.attainment)
    if args.start_rate is not None and not args.start_rate > 0:
        raise ConfigError(f"capacity: --start-rate must be > 0, got {args.start_rate}")
    configs = [shlex.split(c) for c in args.config] or [[]]
    results = []
    for own in configs:
        overrides = [*args.overrides, *own]
        result = search(overrides, slo, args.start_rate, args.tol)
        print(
            f"{' '.join(overrides) or '(defaults)'}: {result.rate:.4g} req/s on {result.gpus} GPU(s) "
            f"({result.goodput_per_gpu:.4g} req/s/GPU), {len(result.probes)} runs"
        )
        results.append(result)
    out = Path(args.output_dir or f"outputs/capacity/{datetime.now():%Y-%m-%d/%H-%M-%S}")
    command = "forge capacity " + " ".join(shlex.quote(a) for a in argv)
    print(f"report: {write_capacity(results, out, command)}")


if __name__ == "__main__":
    main(sys.argv[1:])
