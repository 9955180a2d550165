"""CPU seconds of the simulated clock on issue 16's 10,000-request trace (the trace of
``benchmarks.poisson10k_cpu``), per source tree:

    python -m benchmarks.poisson10k_clock --tree after=. --tree before=/path/to/other/tree --rounds 5

Each run is a fresh process started in the tree's root with ``PYTHONPATH`` = that root. It builds the
engine, wraps the clock's two entry points on that instance (``decode_step_ends``: the steps of decode
runs; ``step_finished``: single steps) and ``recorder.on_decode_run`` in ``time.process_time``
accumulators, and times ``engine.run`` (wrappers included). Rounds alternate the trees back to back;
the load average (``os.getloadavg()[0]``) is printed with each run. Prints a markdown table and the
medians; writes nothing."""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from benchmarks.poisson10k_cpu import run_child

PARTS = ("decode_step_ends", "step_finished", "on_decode_run")
CHILD = """
import json, os, time
from experiments.fidelity import LIMITS, fixed
from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests

cfg = compose_config([*LIMITS, "clock.hardware=a100", "clock.cost=operators", *fixed(10000, 512, 128, 10.0),
                      "progress=false", "report=false"])
engine = build_engine(cfg)
requests = workload_requests(cfg, engine)
spent = {}

def timed(owner, name):
    fn = getattr(owner, name)
    def wrapper(*args):
        t = time.process_time()
        try:
            return fn(*args)
        finally:
            spent[name] = spent.get(name, 0.0) + time.process_time() - t
    setattr(owner, name, wrapper)

timed(engine.clock, "decode_step_ends")
timed(engine.clock, "step_finished")
timed(engine.recorder, "on_decode_run")
t = time.process_time()
engine.run(requests)
print(json.dumps({"run": time.process_time() - t, **spent, "load": os.getloadavg()[0],
                  "num_steps": len(engine.recorder.steps)}))
"""


def run_once(tree: Path) -> dict[str, float]:
    return run_child(tree, CHILD, {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH (repeat)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    trees = dict(t.split("=", 1) for t in args.tree)
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    print("| tree | round | engine.run s | " + " | ".join(f"{p} s" for p in PARTS) + " | load | steps |")
    print("|---|---|---|" + "---|" * len(PARTS) + "---|---|")
    for r in range(1, args.rounds + 1):
        for label, path in trees.items():
            res = run_once(Path(path).resolve())
            runs[label].append(res)
            parts = " | ".join(f"{res.get(p, 0.0):.3f}" for p in PARTS)
            print(f"| {label} | {r} | {res['run']:.3f} | {parts} | {res['load']:.2f} | {res['num_steps']:.0f} |")
    print()
    for label, rs in runs.items():
        medians = {k: statistics.median(x.get(k, 0.0) for x in rs) for k in ("run", *PARTS)}
        print(f"- {label}: medians of {len(rs)}: " + ", ".join(f"{k} {v:.3f} s" for k, v in medians.items()))


if __name__ == "__main__":
    main()
