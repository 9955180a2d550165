"""Copied over vLLM's ``tests/utils.py`` by the harness: forge's stand-ins for what the OpenAI tests import."""

from benchmarks.conformance_vllm.server import (
    ROCM_EXTRA_ARGS,
    VLLM_PATH,
    RemoteOpenAIServer,
    multi_gpu_only,
    requires_fp8,
)

__all__ = ["ROCM_EXTRA_ARGS", "VLLM_PATH", "RemoteOpenAIServer", "multi_gpu_only", "requires_fp8"]
