"""What the shim ``tests/utils.py`` gives vLLM's tests: ``RemoteOpenAIServer`` starting ``forge serve``
(SmolLM2-135M-Instruct, on 127.0.0.1, stopped on exit) instead of ``vllm serve``, and the few helpers
of vLLM's ``tests/utils.py`` the OpenAI tests import."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
import openai
import pytest

from benchmarks.conformance_vllm.flags import serve_args
from experiments.launchers import free_port

ROOT = Path(__file__).resolve().parents[2]  # forge's checkout: forge serve runs from it
LOG_DIR_ENV = "FORGE_VLLM_SUITE_LOGS"  # where each server's log goes (the harness sets it)
FORGE_MODEL_ENV = "FORGE_VLLM_SUITE_MODEL"  # the forge model option served (default smollm2)
START_BOUND_S = 600.0
CONTEXT = {"smollm2": 8192}  # the served model's context length (vLLM's default --max-model-len)
F = TypeVar("F", bound=Callable[..., Any])


def vllm_args(given: list[str], env: dict[str, str], forge_model: str) -> list[str]:
    """vLLM's serve arguments with what vLLM takes by default made explicit: the key in ``VLLM_API_KEY``
    (vLLM's other way to give --api-key) and, without --max-model-len, the model's whole context."""
    args = list(given)
    if "VLLM_API_KEY" in env and "--api-key" not in args:
        args += ["--api-key", env["VLLM_API_KEY"]]
    if forge_model in CONTEXT and not any(a.partition("=")[0] == "--max-model-len" for a in args):
        args += ["--max-model-len", str(CONTEXT[forge_model])]
    return args


class RemoteOpenAIServer:
    """``forge serve`` in a child process for the duration of a ``with`` block."""

    DUMMY_API_KEY = "token-abc123"

    def __init__(
        self, model: str, vllm_serve_args: list[str], *, env_dict: dict[str, str] | None = None, **_: Any
    ) -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        forge_model = os.environ.get(FORGE_MODEL_ENV, "smollm2")
        args = serve_args(model, vllm_args(vllm_serve_args, env_dict or {}, forge_model), self.port, forge_model)
        logs = Path(os.environ.get(LOG_DIR_ENV) or ROOT / "outputs" / "vllm-suite-logs")
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"server-{self.port}.log"
        cmd = [sys.executable, "-m", "forge.cli", "serve", *args.argv, f"hydra.run.dir={logs}/hydra-{self.port}"]
        env = {**os.environ, **(env_dict or {}), "PYTHONPATH": str(ROOT)}
        with self.log_path.open("w") as log:
            log.write(f"vllm serve {model} {' '.join(vllm_serve_args)}\n$ {' '.join(cmd)}\n")
            log.write(f"vLLM flags forge has no setting for: {args.dropped}\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.dropped_flags = args.dropped
        try:
            self._wait_healthy()
        except BaseException:
            self._stop()
            raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_BOUND_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"forge serve exited with {self.proc.returncode} (log: {self.log_path})")
            try:
                if httpx.get(self.url_for("health"), timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"forge serve did not become healthy in {START_BOUND_S} s (log: {self.log_path})")

    def _stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def __enter__(self) -> RemoteOpenAIServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        return f"{self.url_root}/{'/'.join(p.strip('/') for p in parts if p)}"

    def get_client(self, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)

    def get_async_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)


def multi_gpu_only(*, num_gpus: int = 2) -> Callable[[F], F]:
    return pytest.mark.skip(reason=f"needs {num_gpus} GPUs (vLLM's multi_gpu_only)")


requires_fp8 = pytest.mark.skip(reason="needs an FP8-capable GPU (vLLM's requires_fp8)")
ROCM_EXTRA_ARGS: list[str] = []
VLLM_PATH = Path(__file__).resolve().parent  # vLLM's checkout root in vLLM; examples/ is not in the suite
