"""The CPU forge's bench client uses against vLLM's own client on the same server (issue 37: within 1.5x).

    python -m benchmarks.client_cpu --vllm-src vllm-0.33.0.tar.gz [--rounds 3] [--num-prompts 100] \\
        [--request-rate 20] [--output-dir DIR]

Starts ``forge serve tiny`` on a free port, then, in each round, runs forge's client
(``python -m benchmarks.serve --num-prompts N --request-rate R``) and vLLM's
(``benchmarks/vllm_client.py``: vLLM's ``vllm/benchmarks/serve.py`` loop from its sdist) one after
the other against it, each in its own process, with the same prompts (forge's workload, drawn once
and written to a file for vLLM's client) and the same arrival rate. A client's CPU is its process's
user + system seconds (``wait4``), start-up and outputs included. ``--vllm-src`` is vLLM's sdist
(``.tar.gz``, its Python files unpacked to a temporary folder) or an unpacked tree. Writes ``client_cpu.md``
and ``client_cpu.json`` to ``--output-dir`` (default ``outputs/bench/client-cpu-<date>-<time>``;
``--output-dir reports/serve`` regenerates the committed report).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.child_server import ROOT, child_server
from benchmarks.serve import RemoteTokenizer, build_workload, model_cards
from benchmarks.serve_report import git_commit, machine_name


def unpacked(src: Path, into: Path) -> Path:
    """The folder holding ``vllm/``: ``src`` itself, or the Python files of the sdist ``src`` unpacked ``into``."""
    if src.is_dir():
        return src
    with tarfile.open(src) as tar:
        members = [m for m in tar.getmembers() if "/vllm/" in m.name and m.name.endswith(".py") and m.isfile()]
        if not any(m.name.endswith("/vllm/benchmarks/serve.py") for m in members):
            raise SystemExit(f"--vllm-src {src}: no vllm/benchmarks/serve.py in it (give vLLM's sdist)")
        tar.extractall(into, members=members, filter="data")
    return into / members[0].name.split("/vllm/")[0]


def write_prompts(url: str, num_prompts: int, seed: int, path: Path) -> None:
    """The prompts and output lengths forge's client sends for these options, for vLLM's client."""
    card = model_cards(url, {})[0]
    workload = build_workload([f"seed={seed}", f"workload.num_requests={num_prompts}"])
    max_len = int(card.get("max_model_len") or 1 << 30)
    items = []
    for spec in workload.requests(RemoteTokenizer(url, card, {})):
        prompt = spec.prompt_token_ids[: max_len - 1]
        items.append({"prompt": prompt, "output_len": max(1, min(spec.output_len, max_len - len(prompt)))})
    path.write_text(json.dumps(items))


def cpu_seconds(cmd: list[str]) -> float:
    """User + system CPU seconds of ``cmd``, run to its end from the checkout (its output discarded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(args: argparse.Namespace, src: Path, work: Path) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"forge": [], "vllm": []}
    server = [sys.executable, "-m", "forge.cli", "serve", "tiny", "--port", "0", f"hydra.run.dir={work / 'server'}"]
    with child_server(server) as (_, port):
        url = f"http://127.0.0.1:{port}"
        write_prompts(url, args.num_prompts, args.seed, work / "prompts.json")
        load = ["--request-rate", str(args.request_rate)]
        forge = [sys.executable, "-m", "benchmarks.serve", "--url", url, "--num-prompts", str(args.num_prompts)]
        forge += [*load, "--seed", str(args.seed), "--output-dir", str(work / "forge-client")]
        vllm = [sys.executable, "-m", "benchmarks.vllm_client", "--vllm-src", str(src), "--url", url]
        vllm += ["--model", "tiny", "--prompts", str(work / "prompts.json"), *load, "--seed", str(args.seed)]
        for _ in range(args.rounds):
            samples["forge"].append(cpu_seconds(forge))
            samples["vllm"].append(cpu_seconds(vllm))
    return samples


def _row(client: str, runs: list[float]) -> str:
    return f"| {client} | {statistics.median(runs):.2f} | {', '.join(f'{x:.2f}' for x in runs)} |"


def write_report(out_dir: Path, result: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "client_cpu.json").write_text(json.dumps(result, indent=2))
    forge, vllm = result["cpu_s"]["forge"], result["cpu_s"]["vllm"]
    lines = [
        "# Bench client CPU: forge's against vLLM's, on the same server (issue 37)",
        "",
        f"Command: `{result['command']}`  ",
        f"Commit `{result['commit']}`; machine: {result['machine']}; load average {result['load_start']} at start, "
        f"{result['load_end']} at end; server `forge serve tiny`; {result['num_prompts']} requests at "
        f"{result['request_rate']} req/s per client run; {result['rounds']} rounds, forge's client then vLLM's.",
        "",
        "| client | CPU-s (user + sys) per run, median | runs |",
        "|---|---|---|",
        _row("forge (`python -m benchmarks.serve`)", forge),
        _row("vLLM 0.33.0 (`benchmarks/vllm_client.py`)", vllm),
        "",
        f"Ratio forge / vLLM (medians): **{result['ratio']:.2f}** (goal: at most 1.5).",
        "",
        "Each figure is a whole process: start-up, the run, and what each writes (forge: requests.parquet, "
        "summary.json, report.md and latency.png; vLLM: its printed summary). vLLM's client is its own "
        "`vllm/benchmarks/serve.py` loop with five of its imports stood in for (benchmarks/vllm_client.py "
        "says which and why); it does not sample its dataset with a tokenizer, so the real "
        "`vllm bench serve` uses at least this much.",
        "",
    ]
    path = out_dir / "client_cpu.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vllm-src", required=True, type=Path, help="vLLM's sdist (.tar.gz) or its unpacked tree")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default=None, help="default: outputs/bench/client-cpu-<date>-<time>")
    args = p.parse_args(argv)
    load_start = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="forge-client-cpu-") as tmp:
        samples = measure(args, unpacked(args.vllm_src, Path(tmp) / "vllm-src"), Path(tmp))
    result = {
        "command": " ".join(["python -m benchmarks.client_cpu", *(sys.argv[1:] if argv is None else argv)]),
        "commit": git_commit(),
        "machine": machine_name(),
        "load_start": load_start,
        "load_end": round(os.getloadavg()[0], 2),
        **{k: getattr(args, k) for k in ("rounds", "num_prompts", "request_rate", "seed")},
        "cpu_s": samples,
        "ratio": statistics.median(samples["forge"]) / statistics.median(samples["vllm"]),
    }
    out_dir = Path(args.output_dir or f"outputs/bench/client-cpu-{time.strftime('%Y%m%d-%H%M%S')}")
    path = write_report(out_dir, result)
    print(path.read_text())
    return result


if __name__ == "__main__":
    main()
