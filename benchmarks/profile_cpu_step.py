"""Where a forge decode step's time goes on CPU: SmolLM2-135M, 64 running requests.

    python -m benchmarks.profile_cpu_step [--requests 64 --steps 8 --threads 2]

Admits ``requests`` random 128-token prompts, runs until every prompt is computed, then
profiles ``steps`` pure decode steps with ``torch.profiler`` and writes the top operators by
self CPU time, plus the engine's split between scheduling, the model and the update, to
``reports/cpu/profile.md``.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from benchmarks.cpu_real_model import commit, machine
from forge import LLM, SamplingParams
from forge.core.request import Request


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="same")
    ap.add_argument("--out", type=Path, default=Path("reports/cpu/profile.md"))
    ap.add_argument("overrides", nargs="*", help="more config overrides, e.g. backend=cpu")
    args = ap.parse_args()
    llm = LLM(
        "model=smollm2",
        "model.max_position=1024",
        f"model.weights={args.weights}",
        *args.overrides,
        f"engine.max_num_seqs={args.requests}",
        f"backend.num_threads={args.threads}",
    )
    engine = llm.engine
    rng = random.Random(0)
    for i in range(args.requests):
        ids = llm.tokenizer.random_token_ids(128, rng)
        engine.add_request(Request(f"p{i}", ids, SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running) or len(
        engine.scheduler.waiting
    ):
        engine.step()
    phases = {"schedule": 0.0, "model (execute)": 0.0, "update": 0.0}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            sched = engine.scheduler.schedule()
            t1 = time.perf_counter()
            out = engine.runner.execute(sched)
            t2 = time.perf_counter()
            engine.scheduler.update(sched, out, engine.tokenizer.eos_token_ids)
            t3 = time.perf_counter()
            phases["schedule"] += t1 - t0
            phases["model (execute)"] += t2 - t1
            phases["update"] += t3 - t2
    total = sum(phases.values())
    averages = prof.key_averages()
    table = averages.table(sort_by="self_cpu_time_total", row_limit=15)
    in_ops = sum(e.self_cpu_time_total for e in averages) / 1e6  # seconds inside torch operators
    outside = max(phases["model (execute)"] - in_ops, 0.0)
    lines = [
        "# Where a forge decode step goes on CPU",
        "",
        f"Command: `python -m benchmarks.profile_cpu_step --requests {args.requests} --steps {args.steps} "
        f"--threads {args.threads} --weights {args.weights}{''.join(' ' + o for o in args.overrides)}`",
        f"Machine: {machine()}",
        f"Commit: {commit()}",
        "",
        f"SmolLM2-135M, {args.requests} running requests (128-token prompts already computed), "
        f"{args.steps} pure decode steps, {1e3 * total / args.steps:.1f} ms per step "
        "(torch.profiler attached, which adds overhead).",
        "",
        "| phase | ms per step | share |",
        "|---|---|---|",
        *[f"| {k} | {1e3 * v / args.steps:.2f} | {v / total:.1%} |" for k, v in phases.items()],
        "",
        f"Of the model's time, {1e3 * outside / args.steps:.2f} ms per step ({outside / total:.1%}) is outside torch "
        "operators, where the profiler does not see it: forge's C kernels (called through ctypes: `backend=cpu` "
        "decode attention, int8 quantization and rescaling) and Python.",
        "",
        "Top operators by self CPU time:",
        "",
        "```",
        table,
        "```",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
