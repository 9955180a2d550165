"""A simulated run of the synthetic model (no arithmetic) never imports torch (issue 16: ``import torch``
was a quarter of the 10,000-request trace's CPU time), and gives the tokens and metrics of the
torch tensor path. What needs torch in such a run (sampling with temperature > 0, verifying drafts,
prompt logprobs, embeddings) imports it lazily: ``tests/test_sim_speed.py`` and
``tests/test_prompt_logprobs.py`` run those through the ``SimulationRunner``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests
from forge.engine.sim_runner import SimulationRunner
from forge.kernels.base import KVSpec
from forge.kernels.torch_backend import TorchBackend

OVERRIDES = [
    "model=synthetic",
    "clock=simulated",
    "workload.num_requests=12",
    "workload.arrivals.rate=50",
    "progress=false",
    "report=false",
]
RUN = """
import json, sys
from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests
cfg = compose_config(sys.argv[1:])
engine = build_engine(cfg)
finals = engine.run(workload_requests(cfg, engine))
rec = engine.recorder
from forge import LLM, SamplingParams  # the library API too (LLM.generate's server-side request rules)
LLM(*sys.argv[1:]).generate(["hello"], SamplingParams(max_tokens=3, temperature=float(cfg.sampling.temperature)))
print(json.dumps({
    "torch": "torch" in sys.modules,
    "tokens": {rid: out.token_ids for rid, out in finals.items()},
    "steps": rec.steps_frame().to_json(),
    "requests": rec.requests_frame().to_json(),
}))
"""


def run_in_subprocess(overrides: list[str]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", RUN, *overrides], capture_output=True, text=True, check=True, timeout=120
    )
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_a_simulated_synthetic_run_never_imports_torch_and_equals_the_tensor_path() -> None:
    """The default backend (``device=auto``); with a torch build that has GPU support, ``auto`` asks
    torch, so the run names ``backend.device=cpu``."""
    import torch

    cpu_build = torch.version.cuda is None and torch.version.hip is None
    fresh = run_in_subprocess(OVERRIDES if cpu_build else [*OVERRIDES, "backend.device=cpu"])
    assert fresh["torch"] is False
    cfg = compose_config(OVERRIDES)
    engine = build_engine(cfg)
    assert isinstance(engine.runner, SimulationRunner)
    engine.runner.host = False  # every step on the torch tensor path (over the same host memory)
    finals = engine.run(workload_requests(cfg, engine))
    tokens = {rid: out.token_ids for rid, out in finals.items()}
    assert fresh["tokens"] == tokens and len(tokens) == 12
    assert fresh["steps"] == engine.recorder.steps_frame().to_json()
    assert fresh["requests"] == engine.recorder.requests_frame().to_json()


def test_host_kv_store_is_numpy_of_the_specs_dtype() -> None:
    spec = KVSpec(num_layers=2, num_kv_heads=1, head_dim=1, dtype="int64")
    assert spec.bytes_per_token() == 2 * 2 * 8 and not spec.is_floating_point
    backend = TorchBackend("cpu")
    layers = backend.allocate_host_kv_cache(spec, num_blocks=3, block_size=4)
    assert len(layers) == 2 and all(isinstance(a, np.ndarray) and a.shape == (3, 4, 1, 1) for a in layers[0])
    layers[0][0][1] = 7
    backend.copy_host_blocks(layers, layers, [(1, 2), (2, 0)])  # sources read before any write
    assert layers[0][0][:, :, 0, 0].tolist() == [[0] * 4, [7] * 4, [7] * 4]
    with pytest.raises(TypeError, match="numpy dtype"):
        backend.allocate_host_kv_cache(KVSpec(1, 1, 1, spec.torch_dtype()), 3, 4)


SUMMARY = """
import json, sys
import experiments.fidelity as fidelity
summary = fidelity.simulate([*fidelity.LIMITS, *fidelity.fixed(60, 256, 32, 20.0)])
print(json.dumps({"torch": "torch" in sys.modules, "pandas": "pandas" in sys.modules, "steps": summary["num_steps"]}))
"""


def test_the_fidelity_studys_simulate_imports_neither_torch_nor_pandas() -> None:
    """``MetricsRecorder.summary`` gives the summary without building DataFrames (tests/test_metrics_summary.py)."""
    out = subprocess.run([sys.executable, "-c", SUMMARY], capture_output=True, text=True, check=True, timeout=120)
    result = json.loads(out.stdout.splitlines()[-1])
    assert result == {"torch": False, "pandas": False, "steps": result["steps"]} and result["steps"] > 60
