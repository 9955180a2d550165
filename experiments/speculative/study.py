"""Speculative-decoding study: acceptance, tokens per target forward and speedup vs no speculation.

    python experiments/speculative/study.py --model synthetic --clock simulated --out reports/speculative/sim.csv
    python -m experiments.run speculative  # the committed simulated section over the seeds, then the report
    python experiments/speculative/study.py --model tiny --clock wall --out reports/speculative/tiny_wall.csv
    taskset -c 0 python experiments/speculative/study.py --model smollm2 --clock wall --threads 1 --max-tokens 96 \
        --min-requests 8 --kv-gib 2 --out reports/speculative/real_smollm2_wall_per_seed.csv
    python experiments/speculative/study.py --model smollm2 --clock simulated --threads 1 --max-tokens 96 \
        --min-requests 8 --out reports/speculative/real_smollm2_simulated_per_seed.csv

Every case is run without a drafter and with each drafter on identical requests (all arriving at
t = 0, batch = max_num_seqs; number of requests = batch, or the smallest multiple of it that is
at least ``--min-requests``, so that batch 1 averages over several prompts run one after another).
Every case runs once per seed (``--seeds``, default ``experiments.seeds.SEEDS``): the seed is the
``seed`` setting (the synthetic model's tokens) and draws the workload's prompts (``workloads.drawn``:
which stdlib functions / questions, in which order). Greedy outputs with and without speculation are
checked to be identical, per seed. Time is the engine clock from the first step to the last finish.
For the grounded workload, ``copied_fraction`` is the share of the output characters (up to the
length of the expected continuation) that reproduce the prompt's passage verbatim from the start;
``loadavg`` is the 1-minute load average before and after the case (wall times on a shared machine).
``prefill_step_seconds`` / ``decode_step_seconds``: time of the steps that did / did not compute prompt
tokens; ``decode_speedup`` compares the latter, i.e. the generation phase without the (unchanged) prefill.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's packages

from experiments import common
from experiments.seeds import SEEDS
from experiments.speculative.workloads import chat_messages, copied_prefix, drawn_functions, grounded_prompts
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


def run_case(
    model: str,
    workload: str,
    drafter: str,
    clock: str,
    batch: int,
    max_tokens: int,
    threads: int | None,
    num_requests: int,
    kv_gib: float | None = None,
    seed: int = SEEDS[0],
) -> dict[str, Any]:
    overrides = [
        *MODELS[model][workload],
        f"seed={seed}",
        *DRAFTERS[drafter],
        f"clock={clock}",
        f"engine.max_num_seqs={batch}",
        "engine.max_num_batched_tokens=4096",
        *([f"backend.num_threads={threads}"] if threads else []),
        *([f"engine.kv_cache_memory_gib={kv_gib}"] if kv_gib else []),
    ]
    llm = LLM(*overrides)
    expected: list[str] = []
    if workload == "grounded":
        prompts, expected = grounded_prompts(num_requests, seed)
    else:
        prompts = [llm.tokenizer.apply_chat_template(m) for m in chat_messages(num_requests, seed)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine = llm.engine
    load_before = os.getloadavg()[0]
    start = engine.clock.now()
    outs = llm.generate(prompts, params)
    elapsed = engine.clock.now() - start
    load_after = os.getloadavg()[0]
    copied = [copied_prefix(o.text, e) / min(len(o.text), len(e)) for o, e in zip(outs, expected, strict=False)]
    steps = engine.recorder.steps_frame()
    n_out = sum(len(o.token_ids) for o in outs)
    step_seconds = steps["end_time"] - steps["start_time"]
    has_prefill = steps["num_prefill_tokens"] > 0
    accepted = int(steps["num_accepted_tokens"].sum())
    s = engine.spec_stats
    return {
        "model": model,
        "workload": workload,
        "drafter": drafter,
        "clock": clock,
        "batch": batch,
        "seed": seed,
        "requests": num_requests,
        "output_tokens": n_out,
        "seconds": elapsed,
        "steps": len(steps),
        "preemptions": int(steps["num_preempted"].sum()),
        "prefill_step_seconds": float(step_seconds[has_prefill].sum()),
        "decode_step_seconds": float(step_seconds[~has_prefill].sum()),
        "tokens_per_target_forward": n_out / (n_out - accepted),
        "acceptance_rate": s.acceptance_rate,
        "mean_acceptance_length": s.mean_acceptance_length,
        "acceptance_per_position": " ".join(f"{x:.2f}" for x in s.acceptance_per_position),
        "copied_fraction": sum(copied) / len(copied) if copied else float("nan"),
        "loadavg": f"{load_before:.2f}->{load_after:.2f}",
        "outputs": [o.token_ids for o in outs],
        "texts": [o.text for o in outs],
        "expected": expected,
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="synthetic", choices=sorted(MODELS))
    ap.add_argument("--clock", default="simulated", choices=["simulated", "wall"])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--workloads", default="grounded,chat")
    ap.add_argument("--drafters", default="none,ngram")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="each case runs once per seed")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="backend.num_threads (default: torch's)")
    ap.add_argument(
        "--min-requests",
        type=int,
        default=1,
        help="at least this many requests per case (a multiple of the batch; the extra ones queue)",
    )
    ap.add_argument("--kv-gib", type=float, default=None, help="engine.kv_cache_memory_gib (wall clock)")
    ap.add_argument("--show", type=int, default=0, help="print this many outputs of each no-drafter case")
    ap.add_argument(
        "--samples-out", default=None, help="markdown file with the grounded outputs (no drafter, most requests)"
    )
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def provenance(command: str) -> dict[str, str]:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "command": command,
        "commit": common.provenance()["commit"],  # changes under reports/ (study outputs) do not count
        "cpu": f"{cpu}, {os.cpu_count()} cores{common.pinning()}",
        "uptime at start": uptime(),
    }


Samples = tuple[str, int, list[str], list[str]]  # command, seed, expected continuations, outputs


def run_seed(args: argparse.Namespace, workload: str, batch: int, seed: int) -> tuple[list[dict[str, Any]], Samples]:
    """Every drafter on one seed's requests; each row checked against the first drafter's (no drafter)."""
    rows: list[dict[str, Any]] = []
    base: dict[str, Any] = {}
    samples: Samples = ("", seed, [], [])
    num_requests = batch * -(-args.min_requests // batch)
    for drafter in args.drafters.split(","):
        case = (args.model, workload, drafter, args.clock, batch, args.max_tokens, args.threads, num_requests)
        row = run_case(*case, args.kv_gib, seed)
        outputs, texts, expected = row.pop("outputs"), row.pop("texts"), row.pop("expected")
        if not base:
            for text in texts[: args.show]:
                print(f"--- {workload} output (seed {seed}) ---\n{text}\n---", flush=True)
            samples = (" ".join(sys.argv), seed, expected, texts)
            base = {**row, "outputs": outputs}
        row["identical_to_no_spec"] = outputs == base["outputs"]
        row["speedup"] = base["seconds"] / row["seconds"]
        row["decode_speedup"] = base["decode_step_seconds"] / row["decode_step_seconds"]
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        rows.append(row)
    return rows, samples


def main(argv: list[str] | None = None, command: str | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = provenance(command or " ".join(["python", *sys.argv]))
    writer: csv.DictWriter[str] | None = None
    samples: Samples = ("", 0, [], [])
    with out.open("w", newline="") as f:
        f.write("".join(f"# {k}: {v}\n" for k, v in meta.items()))
        for workload in args.workloads.split(","):
            for batch in map(int, args.batches.split(",")):
                for seed in map(int, args.seeds.split(",")):
                    rows, drawn = run_seed(args, workload, batch, seed)
                    if drawn[2] and len(drawn[2]) > len(samples[2]):
                        samples = drawn
                    if writer is None:
                        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                        writer.writeheader()
                    writer.writerows(rows)
                    f.flush()  # a long run leaves its finished cases behind
        f.write(f"# uptime at end: {uptime()}\n")
    if args.samples_out:
        write_samples(Path(args.samples_out), args.model, *samples)


def write_samples(path: Path, model: str, command: str, seed: int, expected: list[str], texts: list[str]) -> None:
    """Each distinct grounded prompt's expected continuation vs the model's greedy output (one seed's)."""
    lines = [
        f"# Grounded workload: what `model={model}` writes (greedy, no drafter)",
        "",
        f"Written by `python {command}` (seed {seed}'s prompts). Per request: characters reproduced verbatim "
        "from the start / characters left in the passage after the prompt's head, then the output.",
        "",
    ]
    seen = set()
    for name, e, t in zip(drawn_functions(len(expected), seed), expected, texts, strict=True):
        if e in seen:
            continue
        seen.add(e)
        lines += [
            f"## {name.__module__}.{name.__name__}: {copied_prefix(t, e)} / {len(e)} characters copied",
            "",
            "```",
            t,
            "```",
            "",
        ]
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
