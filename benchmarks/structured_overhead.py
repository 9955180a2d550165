"""Per-token cost of structured output for each backend, written to reports/serve/.

    python -m benchmarks.structured_overhead [--tokens 4000] [--out reports/serve]

1. Mask micro-benchmark: a seeded random walk through the automaton (each step: ``allowed_mask``
   then ``accept`` of a random allowed token), timing the two calls; restarts when accepting.
2. In the engine: 32 requests on the synthetic model, 0 / 8 / 32 of them constrained; wall time
   per generated token (the masks apply per row, so unconstrained neighbours take the plain path).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.serve_report import machine_name
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.llm import LLM
from forge.structured.base import ConstraintSpec, StructuredBackend
from forge.structured.outlines_backend import OutlinesBackend
from forge.structured.xgrammar_backend import XGrammarBackend

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 24},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "name", "tags", "score", "ok"],
}


def mask_walk(backend: StructuredBackend, spec: ConstraintSpec, tokens: int, seed: int) -> dict[str, float]:
    t = time.perf_counter()
    grammar = backend.compile(spec)
    compile_s = time.perf_counter() - t
    rng = random.Random(seed)
    vocab = backend.tokenizer.vocab_size  # type: ignore[attr-defined]
    budget = 200
    c = grammar.constraint(budget)
    mask_t, accept_t = [], []
    for _ in range(tokens):
        t0 = time.perf_counter()
        mask = c.allowed_mask(vocab)
        t1 = time.perf_counter()
        assert mask is not None
        allowed = mask.nonzero().flatten().tolist()
        tok = rng.choice(allowed)
        t2 = time.perf_counter()
        c.accept(tok)
        t3 = time.perf_counter()
        mask_t.append(t1 - t0)
        accept_t.append(t3 - t2)
        if tok in backend.tokenizer.eos_token_ids or budget - len(mask_t) % budget <= 1:  # type: ignore[attr-defined]
            c = grammar.constraint(budget)
    m, a = np.asarray(mask_t) * 1e6, np.asarray(accept_t) * 1e6
    return {
        "compile_ms": compile_s * 1e3,
        "mask_us_mean": float(m.mean()),
        "mask_us_p50": float(np.median(m)),
        "mask_us_p99": float(np.percentile(m, 99)),
        "accept_us_mean": float(a.mean()),
        "per_token_us_mean": float((m + a).mean()),
    }


def engine_overhead(llm: LLM, backend: StructuredBackend | None, n_constrained: int, out_len: int) -> float:
    """Wall seconds per generated token for 32 requests, ``n_constrained`` with the schema."""
    grammar = backend.compile(ConstraintSpec.json_schema(SCHEMA)) if backend is not None else None
    reqs = []
    for i in range(32):
        params = SamplingParams(
            max_tokens=out_len, temperature=1.0, seed=i, ignore_eos=grammar is None or i >= n_constrained
        )
        constraint = grammar.constraint(out_len) if grammar is not None and i < n_constrained else None
        reqs.append(
            Request(f"o{i}-{time.perf_counter_ns()}", llm.tokenizer.encode(f"p{i}"), params, constraint=constraint)
        )
    t = time.perf_counter()
    finals = llm.engine.run(reqs)
    dt = time.perf_counter() - t
    return dt / sum(len(f.token_ids) for f in finals.values())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4000)
    p.add_argument("--out", default="reports/serve")
    args = p.parse_args(argv)
    llm = LLM("model=synthetic", "engine.max_num_seqs=32")
    specs = {
        "json_schema": ConstraintSpec.json_schema(SCHEMA),
        "regex": ConstraintSpec.regex(r"[a-z]{1,12}@[a-z]{2,8}\.(com|org)"),
    }
    results: dict[str, Any] = {"micro": {}, "engine_s_per_token": {}}
    backends: dict[str, StructuredBackend] = {
        "outlines": OutlinesBackend(llm.tokenizer),
        "xgrammar": XGrammarBackend(llm.tokenizer),
        "xgrammar(no guard)": XGrammarBackend(llm.tokenizer, length_guard=False),
    }
    for bname, backend in backends.items():
        for name, spec in specs.items():
            results["micro"][f"{bname}/{name}"] = mask_walk(backend, spec, args.tokens, seed=0)
    results["engine_s_per_token"]["none/0"] = engine_overhead(llm, None, 0, 64)
    for bname in ("outlines", "xgrammar"):
        backend = backends[bname]
        engine_overhead(llm, backend, 32, 64)  # warm the mask caches / compile
        for k in (8, 32):
            results["engine_s_per_token"][f"{bname}/{k}"] = engine_overhead(llm, backend, k, 64)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    meta = {
        "command": "python -m benchmarks.structured_overhead " + " ".join(argv or []),
        "machine": machine_name(),
        "commit": commit + (" with uncommitted work" if dirty else ""),
        "vocab": f"byte tokenizer, {llm.tokenizer.vocab_size} ids (synthetic model)",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "structured_overhead.json").write_text(json.dumps({**results, **meta}, indent=2))
    lines = ["# Structured output: per-token mask overhead", ""] + [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "## Mask micro-benchmark (random walk, per generated token)", ""]
    lines += [
        "| backend/spec | compile ms | mask µs mean | p50 | p99 | accept µs | total µs/token |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, r in results["micro"].items():
        lines.append(
            f"| {key} | {r['compile_ms']:.1f} | {r['mask_us_mean']:.1f} | {r['mask_us_p50']:.1f} | "
            f"{r['mask_us_p99']:.1f} | {r['accept_us_mean']:.1f} | {r['per_token_us_mean']:.1f} |"
        )
    lines += ["", "## In the engine (32 requests x 64 tokens, synthetic model, wall clock)", ""]
    lines += ["| backend / constrained of 32 | ms per generated token |", "|---|---|"]
    for key, v in results["engine_s_per_token"].items():
        lines.append(f"| {key} | {v * 1e3:.3f} |")
    lines.append("")
    (out / "structured_overhead.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return results


if __name__ == "__main__":
    main()
