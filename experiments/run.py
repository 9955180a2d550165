"""``python -m experiments.run <study> [--size small|tiny] [--out DIR]`` regenerates ``reports/<study>/``.

Studies: fig2_kv_usage, chunked_prefill, policies_load, prefix_caching, fidelity, launchers, kv_sharing, kv_memory,
routing, disaggregation, gpu_capacity, speculative (its simulated section), route_real (see each module's docstring).
``--size tiny`` is a smoke test (seconds; what the test suite runs into a temporary directory).
The studies that compare options (fig2_kv_usage, chunked_prefill, policies_load, prefix_caching, kv_sharing, kv_memory,
routing, speculative) run every configuration with each of ``experiments.seeds.SEEDS`` and report the mean ± 95% CI
over them (kv_memory's deterministic window and accuracy sections run once; speculative's SmolLM2 sections are their
own one-seed commands); disaggregation and gpu_capacity replay fixed traces, so three windows of the trace are their
replicates; route_real runs each router once on real backends (wall clock, no interval)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

STUDIES = (
    "fig2_kv_usage",
    "chunked_prefill",
    "policies_load",
    "prefix_caching",
    "fidelity",
    "launchers",
    "kv_sharing",
    "kv_memory",
    "routing",
    "disaggregation",
    "gpu_capacity",
    "speculative",
    "route_real",
)
REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("study", choices=STUDIES)
    ap.add_argument("--size", choices=("small", "tiny"), default="small")
    ap.add_argument("--out", default=None, help="report directory (default reports/<study>)")
    args = ap.parse_args(argv)
    module = importlib.import_module(f"experiments.{args.study}")
    out = Path(args.out) if args.out else REPO / "reports" / args.study
    module.run(out, args.size)
    print(f"report: {out / 'README.md'}")


if __name__ == "__main__":
    main()
