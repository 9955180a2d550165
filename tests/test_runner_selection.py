"""Fast paths sit behind the component that needs them: the simulation runner for a host model,
CUDA graphs behind the CUDA backend; the generic runner knows neither."""

from __future__ import annotations

import subprocess
import sys

import pytest

from forge.config import compose_config
from forge.engine.build import build_engine
from forge.engine.runner import ModelRunner
from forge.engine.sim_runner import SimulationRunner


def test_the_generic_runner_does_not_import_cuda_graphs() -> None:
    code = "import sys, forge.engine.runner, forge.engine.build; print('forge.kernels.cuda_graphs' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("model", "runner"), [("synthetic", SimulationRunner), ("tiny", ModelRunner)])
def test_build_picks_the_simulation_runner_for_a_host_model(model: str, runner: type) -> None:
    engine = build_engine(compose_config([f"model={model}", "workload.num_requests=1"]))
    assert type(engine.runner) is runner


def test_the_simulation_runner_refuses_a_model_without_forward_host() -> None:
    engine = build_engine(compose_config(["model=tiny", "workload.num_requests=1"]))
    runner = engine.runner
    with pytest.raises(TypeError, match="forward_host"):
        SimulationRunner(runner.model, runner.backend, 4, 16)
