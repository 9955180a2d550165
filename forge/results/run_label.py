"""One line naming a run's key config for plot titles and reports: model, scheduler, KV cache,
clock (and simulated hardware), workload (and arrival rate), and a cluster's replicas and router.

Read from the run directory's files alone: the option names Hydra recorded in
``.hydra/hydra.yaml`` (``runtime.choices``) when the run was started from the command line, else
the ``_target_`` names in ``config.yaml`` (a run made through the library API)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

LABEL_GROUPS = ("model", "scheduler", "kvcache", "clock", "workload")
_CLASS_SUFFIXES = ("KVCache", "_kv_cache", "Clock", "Workload", "Model", "Policy")  # classes and factories


def _choices(run_dir: Path) -> dict[str, str]:
    path = run_dir / ".hydra" / "hydra.yaml"
    if not path.exists():
        return {}
    runtime = (yaml.safe_load(path.read_text()) or {}).get("hydra", {}).get("runtime", {})
    return {str(k): str(v) for k, v in (runtime.get("choices") or {}).items()}


def _target_name(node: Any) -> str | None:
    target = node.get("_target_") if isinstance(node, dict) else None
    if not isinstance(target, str):
        return None
    name = target.rsplit(".", 1)[-1]
    for prefix in ("build_", "load_"):
        name = name.removeprefix(prefix)
    for suffix in _CLASS_SUFFIXES:
        name = name.removesuffix(suffix)
    return name.lower()


def run_label(run_dir: Path | str) -> str:
    """``model=tiny · scheduler=fcfs · kvcache=paged (block 16) · clock=simulated (h100) ·
    workload=poisson (32 requests, 4 req/s)``; a group the run's files do not name is left out."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    config: dict[str, Any] = (yaml.safe_load(config_path.read_text()) or {}) if config_path.exists() else {}
    choices = _choices(run_dir)
    parts = []
    for group in LABEL_GROUPS:
        node = config.get(group)
        arrivals = node.get("arrivals") if isinstance(node, dict) and group == "workload" else None
        name = choices.get(group) or _target_name(arrivals) or _target_name(node)
        if name is None:
            continue
        details = _details(group, node if isinstance(node, dict) else {})
        parts.append(f"{group}={name}" + (f" ({details})" if details else ""))
    cluster = _cluster_part(config, choices)
    return " · ".join([*parts, cluster] if cluster else parts)


def _cluster_part(config: dict[str, Any], choices: dict[str, str]) -> str | None:
    """``cluster=4 replicas (router=least_kv; a100,a100,h100,h100)`` or ``cluster=disaggregated (2
    prefill + 2 decode over nvlink; router=round_robin)``; None for the engine alone."""
    node = config.get("cluster")
    if not isinstance(node, dict):
        return None
    router = choices.get("router") or _target_name(config.get("router")) or "?"
    if "prefill_replicas" in node:
        pools = f"{node['prefill_replicas']} prefill + {node['decode_replicas']} decode over {node.get('link')}"
        return f"cluster=disaggregated ({pools}; router={router})"
    replicas = node.get("replicas", 1)
    if not isinstance(replicas, int) or replicas <= 1:
        return None
    hardware = node.get("hardware")
    where = f"; {','.join(map(str, hardware))}" if isinstance(hardware, list) else ""
    return f"cluster={replicas} replicas (router={router}{where})"


def _details(group: str, node: dict[str, Any]) -> str:
    if group == "kvcache" and node.get("block_size") is not None:
        return f"block {node['block_size']}"
    if group == "clock" and node.get("hardware") is not None:
        return str(node["hardware"])
    if group == "workload":
        bits = []
        if node.get("num_requests") is not None:
            bits.append(f"{node['num_requests']} requests")
        rate = (node.get("arrivals") or {}).get("rate") if isinstance(node.get("arrivals"), dict) else None
        if isinstance(rate, int | float):
            bits.append(f"{rate:g} req/s")
        return ", ".join(bits)
    return ""
