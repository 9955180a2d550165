"""vLLM's own ``vllm bench serve`` client loop, from vLLM's source, against any OpenAI-compatible server:
the yardstick ``benchmarks/client_cpu.py`` holds forge's client to (issue 37: CPU within 1.5x).

    python -m benchmarks.vllm_client --vllm-src DIR --url URL --prompts PROMPTS.json \\
        --request-rate 20 [--seed 0]

``DIR`` is an unpacked vLLM source tree (the sdist, e.g. ``vllm-0.33.0.tar.gz``: the folder holding
``vllm/``); ``PROMPTS.json`` is a list of ``{"prompt": [token ids], "output_len": N}``. What runs is
vLLM's ``vllm/benchmarks/serve.py``: its ``benchmark()`` (the initial test request, gamma arrivals
from ``get_request``, ``aiohttp`` sessions, ``lib/endpoint_request_func.py``'s streaming completions
request, tqdm, ``calculate_metrics``) after its ``freeze_gc_heap()``, as ``vllm bench serve`` calls
them, with ``torch`` imported as ``vllm.utils`` imports it.

What is not vLLM's: the ``vllm`` package is entered without its ``__init__`` (which sets up the
engine), and five modules ``serve.py`` imports are replaced by the few names it takes from them,
because they need packages a forge install does not have (msgspec and zmq, through
``vllm.benchmarks.datasets``, ``vllm.tokenizers`` and ``vllm.utils``'s other modules):
``SampleRequest`` (a dataclass of the same fields), ``get_tokenizer`` (unused: forge's tiny model
has no Hugging Face tokenizer, so the prompts are token ids read from the file, not vLLM's dataset
sampling), ``FlexibleArgumentParser``, ``join_host_port`` and ``freeze_gc_heap`` (vLLM's code,
copied). vLLM's real client also imports transformers and samples its dataset with a tokenizer, so
this process does less than ``vllm bench serve`` would: its CPU is a floor for vLLM's client.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import random
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class SampleRequest:
    """``vllm.benchmarks.datasets.SampleRequest``'s fields."""

    prompt: Any
    prompt_len: int
    expected_output_len: int = 0
    multi_modal_data: Any = None
    lora_request: Any = None
    request_id: str | None = None
    timestamp: float | None = None
    chat_messages: list[dict[str, Any]] | None = None
    request_overrides: dict[str, Any] | None = None


def freeze_gc_heap() -> None:
    """vLLM's (``vllm/utils/gc_utils.py``)."""
    gc.collect(0)
    gc.collect(1)
    gc.collect(2)
    gc.freeze()


def _module(name: str, **names: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(names)
    sys.modules[name] = module
    return module


def load_vllm_serve(src: Path) -> types.ModuleType:
    """``vllm.benchmarks.serve`` from the source tree at ``src``, with the stand-ins above."""
    package = src / "vllm"
    if not (package / "benchmarks" / "serve.py").exists():
        raise SystemExit(f"--vllm-src {src}: no vllm/benchmarks/serve.py there (unpack vLLM's sdist)")
    vllm = _module("vllm")
    vllm.__path__ = [str(package)]
    import torch  # noqa: F401  what vllm.utils (here replaced) imports first

    _module("vllm.utils", __path__=[str(package / "utils")])
    _module("vllm.benchmarks.datasets", SampleRequest=SampleRequest, add_dataset_parser=None, get_samples=None)
    _module("vllm.tokenizers", TokenizerLike=Any, get_tokenizer=None)
    _module("vllm.utils.argparse_utils", FlexibleArgumentParser=argparse.ArgumentParser)
    _module("vllm.utils.gc_utils", freeze_gc_heap=freeze_gc_heap)
    _module("vllm.utils.network_utils", join_host_port=lambda host, port: f"{host}:{port}")
    return importlib.import_module("vllm.benchmarks.serve")


async def run(serve: types.ModuleType, url: str, model: str, requests: list[Any], rate: float) -> dict[str, Any]:
    """``benchmark()`` as ``vllm bench serve --backend openai --endpoint /v1/completions
    --ignore-eos`` calls it, with the defaults of its command line."""
    result: dict[str, Any] = await serve.benchmark(
        task_type=serve.TaskType.GENERATION,
        endpoint_type="openai",
        api_url=url + "/v1/completions",
        base_url=url,
        model_id=model,
        model_name=model,
        tokenizer=None,
        input_requests=requests,
        logprobs=None,
        request_rate=rate,
        burstiness=1.0,
        disable_tqdm=False,
        num_warmups=0,
        profile=False,
        selected_percentile_metrics=["ttft", "tpot", "itl"],
        selected_percentiles=[99.0],
        ignore_eos=True,
        goodput_config_dict={},
        max_concurrency=None,
        lora_modules=None,
        extra_headers=None,
        extra_body=None,
    )
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vllm-src", required=True, type=Path)
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True, type=Path)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    serve = load_vllm_serve(args.vllm_src)
    import numpy as np

    random.seed(args.seed)  # as vLLM's main_async does
    np.random.seed(args.seed)
    items = json.loads(args.prompts.read_text())
    requests = [SampleRequest(it["prompt"], len(it["prompt"]), int(it["output_len"])) for it in items]
    freeze_gc_heap()  # main_async does, just before benchmark()
    result = asyncio.run(run(serve, args.url.rstrip("/"), args.model, requests, args.request_rate))
    print(json.dumps({k: result[k] for k in ("completed", "failed") if k in result}))
    return result


if __name__ == "__main__":
    main()
