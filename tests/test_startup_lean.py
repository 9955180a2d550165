"""``forge``'s start-up stays lean (issue 38: ``forge run`` and a healthy tiny server within 3 s on an
idle machine). What each command does not use it does not import: the command line imports none of
torch, pandas, matplotlib or the server's libraries; a run without a report never loads matplotlib or
the server; a simulated synthetic run never loads torch. And the command runs its imports, config
composition and model build with few cyclic-GC passes (no full collection at all), skipping the full
collection at exit (``forge.engine.gc_pause``): together those passes were ~1 CPU-s of a 4 CPU-s
``forge run``. Each case runs in a fresh interpreter, as a user's command does."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

from forge.engine.gc_pause import PYTHON_DEFAULT_THRESHOLDS, default_gc, rare_gc

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "pandas", "pyarrow", "matplotlib", "fastapi", "uvicorn", "transformers", "httpx")
SMALL_RUN = ["workload.num_requests=4", "progress=false"]

# Runs ``forge <argv>`` through forge.cli.main in this interpreter, then prints which of HEAVY it
# loaded and how many full (oldest-generation) collections ran during the command.
COMMAND_PROBE = f"""
import gc, json, sys
full = []
gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2 and full.append(1))
from forge.cli import main
before = len(full)
main(sys.argv[1:])
heavy = {HEAVY!r}
print(json.dumps({{"loaded": [m for m in heavy if m in sys.modules], "full_collections": len(full) - before}}))
"""


def probe(*argv: str) -> tuple[set[str], int]:
    """The HEAVY libraries ``forge <argv>`` loaded, and the full collections it ran."""
    proc = subprocess.run(
        [sys.executable, "-c", COMMAND_PROBE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return set(result["loaded"]), int(result["full_collections"])


def test_the_command_line_imports_no_heavy_library() -> None:
    code = f"import sys, forge.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_a_run_without_a_report_loads_neither_plotting_nor_the_server(tmp_path: Path) -> None:
    loaded, _ = probe("run", *SMALL_RUN, "report=false", f"hydra.run.dir={tmp_path}")
    assert not loaded & {"matplotlib", "fastapi", "uvicorn", "httpx"}, loaded
    assert (tmp_path / "requests.parquet").exists() and not (tmp_path / "report.md").exists()


def test_a_simulated_synthetic_run_loads_no_torch_even_with_its_report(tmp_path: Path) -> None:
    loaded, _ = probe("run", "model=synthetic", "clock=simulated", *SMALL_RUN, f"hydra.run.dir={tmp_path}")
    assert "torch" not in loaded and "matplotlib" in loaded, loaded
    assert (tmp_path / "latency_cdf.png").exists() and (tmp_path / "report.md").exists()


def test_forge_run_runs_no_full_collection(tmp_path: Path) -> None:
    """The default model (torch imported, the model built): with Python's default thresholds this
    command ran several full collections, each a pass over every object torch and Hydra made."""
    _, full_collections = probe("run", *SMALL_RUN, f"hydra.run.dir={tmp_path}")
    assert full_collections == 0


def test_default_gc_gives_a_server_pythons_thresholds_inside_a_rare_gc_command() -> None:
    before = gc.get_threshold()
    with rare_gc():
        rare = gc.get_threshold()
        with default_gc():
            assert gc.get_threshold() == PYTHON_DEFAULT_THRESHOLDS
        assert gc.get_threshold() == rare
    assert rare[0] >= 100_000 and gc.get_threshold() == before


@pytest.mark.parametrize("skip", [True, False])
def test_no_collection_at_exit_leaves_the_exit_collection_out(skip: bool) -> None:
    """A reference cycle still alive at exit: the interpreter's final collection finalises it,
    unless the process asked to skip that collection."""
    code = f"""
import sys
from forge.engine.gc_pause import no_collection_at_exit
class Node:
    def __del__(self):
        sys.stdout.write("finalised\\n")
a, b = Node(), Node()
a.other, b.other = b, a
del a, b
import gc; gc.disable()  # left to the exit collection
if {skip}:
    no_collection_at_exit()
    no_collection_at_exit()  # registered once however often it is called
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("finalised") == (0 if skip else 2)


def test_the_bench_clients_workload_loads_no_torch() -> None:
    """``benchmarks/serve.py`` builds only the workload (issue 37: its CPU within 1.5x of vLLM's client):
    checking the whole config would import every component's module, torch for the default model
    (~1 CPU-s of its ~4)."""
    code = (
        "import sys\nfrom benchmarks.serve import build_workload\n"
        "w = build_workload(['workload.num_requests=3'])\n"
        "print(type(w).__name__, 'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["SyntheticWorkload", "False"]


def test_the_bench_clients_workload_settings_are_still_checked() -> None:
    from benchmarks.serve import build_workload
    from forge.config import ConfigError

    with pytest.raises(ConfigError, match=r"^workload\.bogus: not a setting of forge\.workloads\.synthetic"):
        build_workload(["+workload.bogus=1"])


def test_forge_bench_startup_reports_forge_runs_wall_and_cpu(tmp_path: Path) -> None:
    """``forge bench startup`` times ``forge run`` too (the default job, or the overrides given), with
    the CPU seconds of its process beside the wall time: the figure a loaded machine does not inflate."""
    argv = ["--repeats", "1", "--no-server", "--output-dir", str(tmp_path), "model=synthetic", "progress=false"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.startup", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "startup.json").read_text())
    wall, cpu = result["phases"]["forge run"]["min"], result["cpu"]["forge run"]["min"]
    assert cpu > 0 and wall > 0 and "server healthy" not in result["cpu"]
    assert "| forge run |" in (tmp_path / "README.md").read_text()


FAKE_VLLM_SERVE = '''
import enum, json, urllib.request
from vllm.benchmarks.datasets import SampleRequest  # the loader's stand-in
from vllm.utils.gc_utils import freeze_gc_heap  # noqa: F401

class TaskType(enum.Enum):
    GENERATION = "generation"

async def benchmark(*, api_url, model_id, input_requests, request_rate, ignore_eos, **_):
    """A stand-in for vLLM's loop: each request once, not streamed."""
    for r in input_requests:
        assert isinstance(r, SampleRequest) and ignore_eos
        body = {"model": model_id, "prompt": r.prompt, "max_tokens": r.expected_output_len, "ignore_eos": True}
        req = urllib.request.Request(api_url, json.dumps(body).encode(), {"content-type": "application/json"})
        json.loads(urllib.request.urlopen(req).read())
    return {"completed": len(input_requests), "failed": 0}
'''


def test_client_cpu_runs_both_clients_from_a_vllm_sdist(tmp_path: Path) -> None:
    """``benchmarks/client_cpu.py`` end to end, with a stand-in for vLLM's ``serve.py`` in an sdist-shaped
    tarball (the real one is not a forge dependency: ``reports/serve/client_cpu.md`` was measured with it)."""
    import tarfile

    serve_py = tmp_path / "serve.py"
    serve_py.write_text(FAKE_VLLM_SERVE)
    sdist = tmp_path / "vllm-0.0.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(serve_py, "vllm-0.0.0/vllm/benchmarks/serve.py")
    out = tmp_path / "out"
    argv = ["--vllm-src", str(sdist), "--rounds", "1", "--num-prompts", "3", "--request-rate", "inf"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.client_cpu", *argv, "--output-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "client_cpu.json").read_text())
    forge_cpu, vllm_cpu = result["cpu_s"]["forge"][0], result["cpu_s"]["vllm"][0]
    assert forge_cpu > 0 and vllm_cpu > 0 and result["ratio"] == forge_cpu / vllm_cpu
    assert "Ratio forge / vLLM" in (out / "client_cpu.md").read_text()
