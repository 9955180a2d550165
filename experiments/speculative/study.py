"""Speculative-decoding study: acceptance, tokens per target forward and speedup vs no speculation.

    python experiments/speculative/study.py --model synthetic --clock simulated --out reports/speculative/sim.csv
    python experiments/speculative/study.py --model tiny --clock wall --out reports/speculative/tiny_wall.csv
    python experiments/speculative/study.py --model smollm2 --clock wall --batches 1 --out reports/speculative/real.csv

Every case is run without a drafter and with each drafter on identical requests (all arriving at
t = 0, batch = max_num_seqs = number of requests). Greedy outputs with and without speculation
are checked to be identical. Time is the engine clock from the first step to the last finish.
"""

from __future__ import annotations

import argparse
import csv
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import chat_messages, grounded_messages

from forge import LLM, SamplingParams

MODELS = {
    # Stand-ins have no notion of "repeat this": their acceptance comes from their own repetitiveness.
    # synthetic: order-1 chains whose repetitiveness stands in for how predictable the output is.
    "synthetic": {
        "grounded": ["model=synthetic", "model.order=1", "model.repetitiveness=0.98"],
        "chat": ["model=synthetic", "model.order=1", "model.repetitiveness=0.8"],
    },
    "tiny": {"grounded": ["model=tiny"], "chat": ["model=tiny"]},
    "smollm2": {"grounded": ["model=smollm2"], "chat": ["model=smollm2"]},
}
DRAFTERS = {
    "none": [],
    "ngram": ["drafter=ngram", "drafter.num_speculative_tokens=5", "drafter.prompt_lookup_max=4"],
    "draft_model": ["drafter=draft_model", "drafter.num_speculative_tokens=4"],
}


def run_case(model: str, workload: str, drafter: str, clock: str, batch: int, max_tokens: int) -> dict[str, Any]:
    overrides = [
        *MODELS[model][workload],
        *DRAFTERS[drafter],
        f"clock={clock}",
        f"engine.max_num_seqs={batch}",
        "engine.max_num_batched_tokens=4096",
    ]
    llm = LLM(*overrides)
    messages = grounded_messages(batch) if workload == "grounded" else chat_messages(batch)
    prompts = [llm.tokenizer.apply_chat_template(m) for m in messages]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine = llm.engine
    start = engine.clock.now()
    outs = llm.generate(prompts, params)
    elapsed = engine.clock.now() - start
    steps = engine.recorder.steps_frame()
    n_out = sum(len(o.token_ids) for o in outs)
    accepted = int(steps["num_accepted_tokens"].sum())
    s = engine.spec_stats
    return {
        "model": model,
        "workload": workload,
        "drafter": drafter,
        "clock": clock,
        "batch": batch,
        "output_tokens": n_out,
        "seconds": elapsed,
        "steps": len(steps),
        "tokens_per_target_forward": n_out / (n_out - accepted),
        "acceptance_rate": s.acceptance_rate,
        "mean_acceptance_length": s.mean_acceptance_length,
        "acceptance_per_position": " ".join(f"{x:.2f}" for x in s.acceptance_per_position),
        "outputs": [o.token_ids for o in outs],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="synthetic", choices=sorted(MODELS))
    ap.add_argument("--clock", default="simulated", choices=["simulated", "wall"])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--workloads", default="grounded,chat")
    ap.add_argument("--drafters", default="none,ngram")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    meta = {"command": " ".join(["python", *sys.argv]), "commit": f"{rev} with uncommitted work", "cpu": cpu}
    writer: csv.DictWriter[str] | None = None
    with out.open("w", newline="") as f:
        f.write("".join(f"# {k}: {v}\n" for k, v in meta.items()))
        for workload in args.workloads.split(","):
            for batch in map(int, args.batches.split(",")):
                base: dict[str, Any] | None = None
                for drafter in args.drafters.split(","):
                    row = run_case(args.model, workload, drafter, args.clock, batch, args.max_tokens)
                    outputs = row.pop("outputs")
                    if base is None:
                        base = {"seconds": row["seconds"], "outputs": outputs}
                    row["identical_to_no_spec"] = outputs == base["outputs"]
                    row["speedup"] = base["seconds"] / row["seconds"]
                    if writer is None:
                        writer = csv.DictWriter(f, fieldnames=list(row))
                        writer.writeheader()
                    writer.writerow(row)
                    f.flush()  # a long run leaves its finished cases behind
                    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)


if __name__ == "__main__":
    main()
