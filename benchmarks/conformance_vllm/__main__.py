"""``python -m benchmarks.conformance_vllm``: run vLLM's OpenAI-server tests against forge serve and write
the table (reports/serve/conformance-vllm.{md,csv,json}); exits 1 when a test is classed a forge bug."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.conformance_vllm import report, source
from benchmarks.conformance_vllm.classify import BUG, verdicts
from benchmarks.conformance_vllm.plugin import RESULTS_ENV
from benchmarks.conformance_vllm.rules import NOT_RUN, RULES
from benchmarks.conformance_vllm.server import FORGE_MODEL_ENV, LOG_DIR_ENV, ROOT
from benchmarks.conformance_vllm.workdir import prepare
from benchmarks.serve_report import git_commit, machine_name
from forge.core.cache import cache_dir


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.conformance_vllm", description=__doc__)
    p.add_argument(
        "--output-dir",
        default=None,
        help="where the table goes (default: outputs/bench/conformance-vllm-<date>-<time>; "
        "the committed one: --output-dir reports/serve)",
    )
    p.add_argument("--workdir", default=None, help="where the suite is extracted and run (emptied first)")
    p.add_argument("--sdist", default=None, help="a local copy of the sdist (its sha256 is checked)")
    p.add_argument("--model", default="smollm2", help="the forge model option every server serves")
    p.add_argument(
        "--reclassify", action="store_true", help="class the last run's results again (after editing rules.py)"
    )
    p.add_argument("files", nargs="*", help=f"test files or ids under {source.SUITE} (default: all of it)")
    return p.parse_args(list(argv))


def sdist_path(given: str | None) -> Path:
    if given is None:
        return source.sdist()
    path = Path(given)
    if source.sha256_of(path) != source.SHA256:
        raise SystemExit(f"{path}: not vLLM {source.VERSION}'s sdist (sha256 differs)")
    return path


def run_suite(workdir: Path, targets: Sequence[str], model: str, command: str) -> dict[str, Any]:
    """The suite's pytest in a child process (results in ``workdir``); what was run, its wall and CPU seconds."""
    results = workdir / "results.jsonl"
    env = {**os.environ, RESULTS_ENV: str(results), LOG_DIR_ENV: str(workdir / "logs"), FORGE_MODEL_ENV: model}
    env["PYTHONPATH"] = os.pathsep.join([str(workdir), str(ROOT)])
    cmd = [sys.executable, "-m", "pytest", "-p", "benchmarks.conformance_vllm.plugin", "-p", "no:cacheprovider"]
    cmd += ["--continue-on-collection-errors", "-q", "-rN", *targets]
    cmd += [f"--deselect={source.SUITE}/{test}" for test, _ in NOT_RUN]
    t0, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    with (workdir / "pytest.log").open("w") as log:
        subprocess.run(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    run = {
        "command": command,
        "targets": list(targets),
        "model": model,
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(cpu, 1),
        "commit": git_commit(),
        "machine": machine_name(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (workdir / "run.json").write_text(json.dumps(run, indent=1))
    return run


def records_of(workdir: Path) -> list[dict[str, Any]]:
    results = workdir / "results.jsonl"
    return [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    workdir = Path(args.workdir or cache_dir() / "vllm-suite" / "run").resolve()
    command = " ".join(["python -m benchmarks.conformance_vllm", *argv])
    if args.reclassify:
        run = json.loads((workdir / "run.json").read_text())
    else:
        prepare(sdist_path(args.sdist), workdir)
        targets = [f"{source.SUITE}/{f}" for f in args.files] or [source.SUITE]
        run = run_suite(workdir, targets, args.model, command)
    found = verdicts(records_of(workdir), RULES)
    meta = {
        "command": run["command"],
        "suite": f"vLLM {source.VERSION} {' '.join(run['targets'])} (sdist sha256 {source.SHA256})",
        "forge model served": f"{run['model']}, under each test's model name",
        "machine": run["machine"],
        "commit": run["commit"],
        "date": run["date"],
        "seconds (pytest and its servers)": f"{run['wall_s']} wall, {run['cpu_s']} CPU (user+sys)",
    }
    if args.reclassify:
        meta["classed"] = f"again by `{command}` at {git_commit()} (rules.py edited after the run)"
    out = args.output_dir or f"outputs/bench/conformance-vllm-{time.strftime('%Y%m%d-%H%M%S')}"
    path = report.write(Path(out), found, meta, NOT_RUN)
    bugs = sum(v.klass == BUG for v in found)
    print(f"{path}: {len(found)} tests, {bugs} classed forge bug")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
