"""Compile time of each structured backend on issue 13's pathological grammars, written to reports/serve/.

    python -m benchmarks.grammar_compile [--timeout 20] [--memory-mb 2048] [--out reports/serve]

Each compile runs in a ``CompilePool`` worker (as the server runs it) with a generous budget, so
a case either finishes (its time and DFA states) or shows which limit it hit. Times are from
sending the spec to the worker to the reply (the worker is started before, by a trivial compile).
Vocabulary: the byte tokenizer of the stand-in models (320 ids).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.serve_report import machine_name
from forge.structured.base import ConstraintSpec, GrammarError, GrammarTooLarge, StructuredBackend
from forge.structured.compile_pool import CompilePool
from forge.structured.outlines_backend import DFAGrammar, OutlinesBackend
from forge.structured.xgrammar_backend import XGrammarBackend, XGrammarGrammar
from forge.tokenizers.base import ByteTokenizer

CASES = {
    'json_schema {"type":"string","maxLength":12}': ConstraintSpec.json_schema({"type": "string", "maxLength": 12}),
    'json_schema {"type":"string","maxLength":16}': ConstraintSpec.json_schema({"type": "string", "maxLength": 16}),
    'json_schema {"type":"string","maxLength":18}': ConstraintSpec.json_schema({"type": "string", "maxLength": 18}),
    'regex "a{100000}"': ConstraintSpec.regex("a{100000}"),
    'json_schema {"type":"array","minItems":100000}': ConstraintSpec.json_schema({"type": "array", "minItems": 100000}),
    'json_schema {"type":"object"}': ConstraintSpec.json_schema({"type": "object"}),
    'regex "[ab]*a[ab]{16}"': ConstraintSpec.regex("[ab]*a[ab]{16}"),
    "json_object (forge's depth-2 regex)": ConstraintSpec.json_object(),
}
WARM = ConstraintSpec.regex("warm")


def states(grammar: object) -> int | None:
    guide = grammar.guide if isinstance(grammar, DFAGrammar | XGrammarGrammar) else None
    return len(guide.transitions) if guide is not None else None


def measure(backend: StructuredBackend) -> dict[str, dict[str, Any]]:
    pool = CompilePool(backend)
    out: dict[str, dict[str, Any]] = {}
    try:
        for name, spec in CASES.items():
            pool.compile_blocking(WARM)  # (re)start the worker outside the timing
            t0 = time.perf_counter()
            try:
                grammar = pool.compile_blocking(spec)
                result: dict[str, Any] = {"outcome": "ok", "states": states(grammar)}
            except GrammarTooLarge as exc:
                result = {"outcome": "over budget", "message": str(exc)}
            except GrammarError as exc:
                result = {"outcome": "error", "message": str(exc)}
            result["seconds"] = time.perf_counter() - t0
            out[name] = result
            print(backend.name, name, result, flush=True)
    finally:
        pool.close()
    return out


def cell(r: dict[str, Any], timeout_s: float, memory_mb: int) -> str:
    if r["outcome"] == "ok":
        return f"{r['seconds']:.2f} s" + (f" ({r['states']} states)" if r["states"] is not None else "")
    msg = r["message"]
    if "compile_memory_mb" in msg:
        return f"> {memory_mb} MB ({r['seconds']:.1f} s)"
    if "max_states" in msg:
        return f"> max_states ({r['seconds']:.1f} s)"
    if "compile_timeout_s" in msg:
        return f"> {timeout_s:g} s"
    return f"error: {msg[:60]}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--memory-mb", type=int, default=2048)
    p.add_argument("--max-states", type=int, default=1_000_000)
    p.add_argument("--out", default="reports/serve")
    args = p.parse_args(argv)
    tok = ByteTokenizer(320)
    t, mb, n = args.timeout, args.memory_mb, args.max_states
    backends: dict[str, StructuredBackend] = {
        "outlines": OutlinesBackend(tok, compile_timeout_s=t, compile_memory_mb=mb, max_states=n),
        "xgrammar": XGrammarBackend(tok, compile_timeout_s=t, compile_memory_mb=mb, max_states=n),
        "xgrammar(no guard)": XGrammarBackend(
            tok, length_guard=False, compile_timeout_s=t, compile_memory_mb=mb, max_states=n
        ),
    }
    results = {name: measure(backend) for name, backend in backends.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    meta = {
        "command": "python -m benchmarks.grammar_compile " + " ".join(argv or []),
        "machine": machine_name(),
        "commit": commit + (" with uncommitted work" if dirty else ""),
        "budget": f"{args.timeout:g} s, {args.memory_mb} MB, {args.max_states} states per compile",
        "vocab": "byte tokenizer, 320 ids",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grammar_compile.json").write_text(json.dumps({"results": results, **meta}, indent=2))
    lines = ["# Structured output: grammar compile time per backend", ""] + [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "| grammar | " + " | ".join(backends) + " |", "|---|" + "---|" * len(backends)]
    for case in CASES:
        row = [cell(results[b][case], args.timeout, args.memory_mb) for b in backends]
        lines.append(f"| {case} | " + " | ".join(row) + " |")
    lines.append("")
    (out / "grammar_compile.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return results


if __name__ == "__main__":
    main()
