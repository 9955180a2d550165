"""``vllm serve`` flags as ``forge serve`` arguments: each flag vLLM's tests pass is mapped onto the forge
setting that does the same, ignored where it tunes vLLM's GPU engine without changing what a client sees,
or dropped (the test then meets forge's own behaviour, and its outcome is classed by the rules)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# vLLM flag -> forge override key (the flag's first value is the override's value)
VALUED = {
    "--max-model-len": "engine.max_model_len",
    "--max-num-seqs": "engine.max_num_seqs",
    "--max-num-batched-tokens": "engine.max_num_batched_tokens",
    "--block-size": "kvcache.block_size",
    "--max-logprobs": "server.max_logprobs",
    "--seed": "seed",
}
SWITCHES = {
    "--enable-prefix-caching": "kvcache.enable_prefix_caching=true",
    "--no-enable-prefix-caching": "kvcache.enable_prefix_caching=false",
    "--enable-chunked-prefill": "engine.enable_chunked_prefill=true",
}
# GPU engine tuning: no effect on the HTTP API (forge's CPU engine has no such knob)
IGNORED = frozenset(
    {
        "--enforce-eager",
        "--dtype",
        "--gpu-memory-utilization",
        "--no-async-scheduling",
        "--attention-backend",
        "--trust-remote-code",
        "--tensor-parallel-size",
        "--enable-auto-tool-choice",  # forge's tool_choice "auto" needs no switch (server.tool_call_parser)
    }
)
TOOL_PARSERS = frozenset({"hermes", "llama3_json", "mistral"})


@dataclass
class ServeArgs:
    """forge serve's arguments for one ``vllm serve`` command line, and the vLLM flags left out."""

    argv: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    served_name: str = ""


def flag_groups(args: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``["--a", "1", "--b", "--c", "x", "y"]`` -> ``[("--a", ["1"]), ("--b", []), ("--c", ["x", "y"])]``
    (``--a=1`` is ``("--a", ["1"])``)."""
    groups: list[tuple[str, list[str]]] = []
    for arg in args:
        if arg.startswith("--"):
            flag, eq, value = arg.partition("=")
            groups.append((flag, [value] if eq else []))
        elif groups:
            groups[-1][1].append(arg)
        else:
            groups.append(("", [arg]))
    return groups


def _mapped(flag: str, values: list[str]) -> list[str] | None:
    """forge's arguments for one flag, [] for an ignored one, None for one forge has no setting for."""
    if flag in VALUED and values:
        return [f"{VALUED[flag]}={values[0]}"]
    if flag in SWITCHES and not values:
        return [SWITCHES[flag]]
    if flag in IGNORED:
        return []
    if flag == "--api-key" and values:
        return ["--api-key", values[0]]
    if flag == "--tool-call-parser" and values and values[0] in TOOL_PARSERS:
        return [f"server.tool_call_parser={values[0]}"]
    if flag == "--chat-template" and values and Path(values[0]).is_file():
        return [f"server.chat_template={values[0]}"]
    return None


def serve_args(model: str, vllm_args: Sequence[str], port: int, forge_model: str = "smollm2") -> ServeArgs:
    """``forge serve`` arguments serving ``forge_model`` under vLLM's model name (or --served-model-name)
    on 127.0.0.1:``port``; the vLLM flags forge has no setting for are listed in ``dropped``."""
    served, mapped, dropped = model, [], []
    for flag, values in flag_groups(vllm_args):
        if flag == "--served-model-name" and values:
            served = values[0]
        elif flag not in ("--port", "--host"):
            forge_args = _mapped(flag, values)
            if forge_args is None:
                dropped.append(" ".join([flag, *values]).strip())
            else:
                mapped.extend(forge_args)
    head = [forge_model, "--port", str(port), "--host", "127.0.0.1", f"server.served_model_name={served}"]
    return ServeArgs(argv=[*head, *mapped], dropped=dropped, served_name=served)
