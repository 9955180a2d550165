"""The ``forge serve`` command that stands in for a llama.cpp test's ``llama-server``.

llama.cpp's server tests (``tools/server/tests``) configure a ``ServerProcess`` (``utils.py``) with
llama-server's options and start it. ``launch_for`` reads those options and returns the forge server
that takes their place, or raises ``Unmapped`` naming the first option forge serve has no equivalent
of (the test then fails with that message, and the harness classes it from ``UNMAPPED``). Every
option is in exactly one of ``MAPPED``, ``IGNORED`` or ``UNMAPPED``; ``tests/test_conformance_llama_cpp.py``
checks that against the attributes of the vendored ``ServerProcess``."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNMAPPED_PREFIX = "forge-conformance: llama-server option forge serve does not offer:"

# the presets' language models (tinyllama2, stories15m_moe, tinyllama_infill; the default model):
# forge serves its own model in their place (SmolLM2 or model=tiny)
LM_MODELS = frozenset(
    {
        ("ggml-org/models", "tinyllamas/stories260K.gguf"),
        ("ggml-org/test-model-stories260K", None),
        ("ggml-org/test-model-stories260K-infill", None),
        ("ggml-org/stories15M_MOE", "stories15M_MOE-F16.gguf"),
        ("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf"),  # embeddings: forge pools the LM's states
    }
)
# llama.cpp's test models that are not language models forge can stand in for: (class, reason)
OTHER_MODELS = {
    (None, None): ("vendor-only", "no model: llama-server's router mode (models loaded on request)"),
    ("ggml-org/test-preset-ci", None): ("vendor-only", "llama-server's router mode (a models preset)"),
    ("ggml-org/models", "jina-reranker-v1-tiny-en/ggml-model-f16.gguf"): (
        "vendor-only",
        "a reranker model: forge serves no reranking",
    ),
    ("ggml-org/tinygemma3-GGUF:Q8_0", None): ("vendor-only", "a multimodal model: forge serves text models only"),
}
# the options the launch maps (ServerProcess attribute -> what it becomes)
MAPPED = {
    "server_port": "--port 0 (the test's server_port is set to the port forge listens on)",
    "server_host": "--host (127.0.0.1 only)",
    "model_hf_repo": "model=smollm2|tiny for the presets' language models (LM_MODELS)",
    "model_hf_file": "with model_hf_repo",
    "model_alias": "--served-model-name",
    "n_ctx": "--max-model-len (capped at the model's context)",
    "n_slots": "--max-num-seqs",
    "api_key": "--api-key",
    "chat_template_file": "server.chat_template (a file of the extracted llama.cpp tree)",
    "pooling": "embedding.pooling (mean, last)",
    "n_predict": "a request's max_tokens (n_predict) when it has none (forge has no server-wide default)",
}
# options that change neither the API nor what a test may check of forge
IGNORED = {
    "debug": "logging",
    "log_path": "logging (forge's log goes to the harness's own file)",
    "offline": "downloads (forge downloads nothing here)",
    "temperature": "llama-server's default temperature (requests set their own)",
    "seed": "llama-server's default seed (requests set their own)",
    "n_threads": "performance",
    "n_gpu_layer": "performance",
    "n_batch": "performance",
    "n_ubatch": "performance",
    "server_continuous_batching": "forge always batches continuously",
    "kv_unified": "performance",
    "fa": "performance (flash attention)",
    "cache_prompt": "performance (forge's prefix cache is a server setting)",
    "server_embeddings": "forge always serves /v1/embeddings",
    "server_metrics": "forge always serves /metrics",
    "no_ui": "forge has no web UI",
    "jinja": "forge always renders the model's Jinja2 template",
    "n_prompts": "not passed to llama-server either",
    "id_slot": "not passed to llama-server either",
    "external_server": "the harness starts forge itself",
    "server_path": "forge serve replaces the binary",
    "process": "session state",
}
# option -> (class, reason): set (not None/False/0), the test cannot run on forge as written
UNMAPPED: dict[str, tuple[str, str]] = {
    "model_file": (
        "model-specific",
        "a model from Hugging Face the harness does not download; the test checks its output",
    ),
    "model_url": ("model-specific", "a model downloaded by URL (the harness downloads no model)"),
    "model_draft": ("vendor-only", "llama.cpp's draft-model speculative decoding (--model-draft)"),
    "model_tags": ("vendor-only", "llama-server's model tags (router mode)"),
    "models_dir": ("vendor-only", "llama-server's router mode (--models-dir)"),
    "models_max": ("vendor-only", "llama-server's router mode (--models-max)"),
    "models_preset": ("vendor-only", "llama-server's router mode (--models-preset)"),
    "no_models_autoload": ("vendor-only", "llama-server's router mode"),
    "server_reranking": ("vendor-only", "reranking (/rerank): forge serves no reranker"),
    "server_slots": ("vendor-only", "llama-server's /slots endpoint"),
    "slot_save_path": ("vendor-only", "llama-server's slot save/restore"),
    "lora_files": ("vendor-only", "LoRA adapters: forge has none"),
    "enable_ctx_shift": ("vendor-only", "llama.cpp's context shift"),
    "n_ga": ("vendor-only", "llama.cpp's group attention (self-extend)"),
    "n_ga_w": ("vendor-only", "llama.cpp's group attention (self-extend)"),
    "ctk": ("vendor-only", "llama.cpp's KV cache types (-ctk)"),
    "ctv": ("vendor-only", "llama.cpp's KV cache types (-ctv)"),
    "swa_full": ("vendor-only", "llama.cpp's full-size SWA cache"),
    "spec_type": ("vendor-only", "llama.cpp's speculative decoding types"),
    "spec_draft_n_min": ("vendor-only", "llama.cpp's speculative decoding settings"),
    "spec_draft_n_max": ("vendor-only", "llama.cpp's speculative decoding settings"),
    "spec_synth_len": ("vendor-only", "llama.cpp's synthetic speculative decoding"),
    "spec_synth_rates": ("vendor-only", "llama.cpp's synthetic speculative decoding"),
    "reasoning_format": ("vendor-only", "llama.cpp's reasoning_content extraction"),
    "reasoning": ("vendor-only", "llama.cpp's reasoning on/off switch"),
    "chat_template": ("vendor-only", "llama.cpp's built-in chat template names (--chat-template NAME)"),
    "mmproj_url": ("vendor-only", "multimodal projectors: forge serves text models only"),
    "no_mmproj": ("vendor-only", "multimodal projectors: forge serves text models only"),
    "media_path": ("vendor-only", "llama-server's local media files"),
    "sleep_idle_seconds": ("vendor-only", "llama-server's idle sleep"),
    "cache_ram": ("vendor-only", "llama-server's host-memory prompt cache"),
    "no_cache_idle_slots": ("vendor-only", "llama-server's idle-slot cache"),
    "ui_mcp_proxy": ("vendor-only", "llama-server's web UI MCP proxy"),
    "backend_sampling": ("vendor-only", "llama.cpp's backend sampling"),
    "gcp_compat": ("vendor-only", "Google Cloud (Vertex AI) prediction routes"),
    "server_tools": ("vendor-only", "llama-server's built-in tools"),
    "server_tools_runtime": ("vendor-only", "llama-server's built-in tools"),
    "mcp_servers_config": ("vendor-only", "llama-server's MCP client"),
    "mcp_servers_json": ("vendor-only", "llama-server's MCP client"),
    "cors_origins": ("vendor-only", "llama-server's CORS settings"),
    # refused for some values only (these are in MAPPED too)
    "server_host": ("vendor-only", "listening on another or several addresses (the harness binds 127.0.0.1 only)"),
    "pooling": ("vendor-only", "llama.cpp's cls/none/rank pooling (forge pools mean or last)"),
}
MODEL_CONTEXT = {"smollm2": 2048, "tiny": 4096}


class Unmapped(RuntimeError):
    """A llama-server option forge serve has no equivalent of (the message names it, its class and
    the reason: ``UNMAPPED``'s unless given)."""

    def __init__(self, option: str, detail: str = "", why: tuple[str, str] | None = None) -> None:
        klass, reason = why or UNMAPPED[option]
        super().__init__(f"{UNMAPPED_PREFIX} {option}{detail} [{klass}] {reason}")
        self.option = option


@dataclass(frozen=True)
class Launch:
    """One forge server: the command's arguments after ``forge serve``, its API key, served name."""

    args: tuple[str, ...]
    api_key: str | None
    served_name: str
    n_predict: int | None  # emulated per request: llama-server's --n-predict as a default max_tokens

    def command(self) -> list[str]:
        key = ["--api-key", self.api_key] if self.api_key else []
        return [sys.executable, "-m", "forge.cli", "serve", *self.args, *key]


def _check_unmapped(server: Any) -> None:
    for option in UNMAPPED.keys() - MAPPED.keys():
        value = getattr(server, option, None)
        if value not in (None, False, 0, ""):
            raise Unmapped(option, f"={value}")
    if server.server_host != "127.0.0.1":
        raise Unmapped("server_host", f"={server.server_host}")
    if server.pooling not in (None, "mean", "last"):
        raise Unmapped("pooling", f"={server.pooling}")


def _template_args(server: Any, tests_dir: Path) -> list[str]:
    name = getattr(server, "chat_template_file", None)
    if not name:
        return []
    path = (tests_dir / str(name)).resolve()
    if not path.is_file():
        raise Unmapped("chat_template", f" (file {name}: not in the extracted llama.cpp tree)")
    return [f"server.chat_template={path}"]


def launch_for(server: Any, model: str, tests_dir: Path) -> Launch:
    """The forge server for a configured ``ServerProcess`` (raises ``Unmapped``: the model first)."""
    repo = (server.model_hf_repo, server.model_hf_file)
    if repo not in LM_MODELS:
        why = OTHER_MODELS.get(repo, UNMAPPED["model_file"])
        raise Unmapped("model_file", f" (--hf-repo {repo[0]} --hf-file {repo[1]})", why)
    _check_unmapped(server)
    args = [model, "--port", "0", "--host", "127.0.0.1"]
    if server.n_ctx:
        args += ["--max-model-len", str(min(int(server.n_ctx), MODEL_CONTEXT[model]))]
    if server.n_slots:
        args += ["--max-num-seqs", str(int(server.n_slots))]
    served = str(server.model_alias or model)
    args += ["--served-model-name", served, *_template_args(server, tests_dir)]
    if server.pooling:
        args.append(f"embedding.pooling={server.pooling}")
    n_predict = int(server.n_predict) if server.n_predict else None
    return Launch(tuple(args), server.api_key or None, served, n_predict)
