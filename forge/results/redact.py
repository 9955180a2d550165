"""Secrets never reach the run directory.

A secret is the value of a setting named in ``SECRET_FIELDS`` (``server.api_keys``, ``server.admin_api_keys``,
``server.admin_key``), wherever it appears: the setting itself, a command-line override that sets
it, or any other string that contains it (Hydra's ``override_dirname``). Everything forge or Hydra
writes into a run directory goes through this module: ``redact_config`` for forge's own
``config.yaml``, and ``RedactSecretsCallback`` (registered in ``conf/config.yaml``) rewrites the
files Hydra saved in ``.hydra/`` (and a sweep's ``multirun.yaml``) as soon as the job starts,
before the job runs.

Keys that should not even be typed on the command line can come from the environment
(``FORGE_API_KEY``, ``FORGE_ADMIN_KEY``, or ``server.api_keys=[${oc.env:MY_KEY}]``: the saved
config keeps the interpolation, not its value)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

SECRET_FIELDS = frozenset({"api_key", "api_keys", "admin_key", "admin_api_keys"})
REDACTED = "<redacted>"  # a plain YAML string (forge.results.sweep parses override values as YAML)
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")


def _is_interpolation(text: str) -> bool:
    return text.startswith("${") and text.endswith("}")


def _strings(value: Any) -> list[str]:
    """The non-empty strings a secret setting holds (a key, or a list of keys)."""
    items = value if isinstance(value, list | tuple) else [value]
    return [str(v) for v in items if v is not None and str(v) != "" and not _is_interpolation(str(v))]


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _is_secret_override(override: str) -> bool:
    return "=" in override and _override_key(override).rsplit(".", 1)[-1] in SECRET_FIELDS


def _override_value(override: str) -> Any:
    text = override.split("=", 1)[1]
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def secret_values(node: Any, overrides: Iterable[str] = ()) -> frozenset[str]:
    """Every secret in a plain (``OmegaConf.to_container``) config and in command-line overrides."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if str(key) in SECRET_FIELDS:
                    found.update(_strings(value))
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    for override in overrides:
        if _is_secret_override(override):
            found.update(_strings(_override_value(override)))
    found.discard(REDACTED)
    return frozenset(found)


def scrub(text: str, secrets: frozenset[str]) -> str:
    """``text`` with every occurrence of a secret replaced by ``REDACTED`` (longest first)."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redact_overrides(overrides: Iterable[str], secrets: frozenset[str]) -> list[str]:
    """Overrides with the value of every secret setting replaced and every other secret scrubbed."""
    return [f"{o.split('=', 1)[0]}={REDACTED}" if _is_secret_override(o) else scrub(o, secrets) for o in overrides]


def redact_container(node: Any, secrets: frozenset[str]) -> Any:
    """A copy of a plain config: each secret setting's keys replaced by ``REDACTED`` (a list keeps
    its length), every string redacted as an override and scrubbed of the secrets."""
    if isinstance(node, dict):
        out: dict[Any, Any] = {}
        for key, value in node.items():
            if str(key) in SECRET_FIELDS and isinstance(value, list):
                out[key] = [v if _is_interpolation(str(v)) else REDACTED for v in value]
            elif str(key) in SECRET_FIELDS and isinstance(value, str) and value and not _is_interpolation(value):
                out[key] = REDACTED
            else:
                out[key] = redact_container(value, secrets)
        return out
    if isinstance(node, list):
        return [redact_container(v, secrets) for v in node]
    if isinstance(node, str):  # an override (hydra.overrides.task) or any text
        return redact_overrides([node], secrets)[0]
    return node


def redact_config(cfg: DictConfig) -> DictConfig:
    """``cfg`` (unresolved) with its secrets redacted, for writing into a run directory."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    redacted = OmegaConf.create(redact_container(plain, secret_values(plain)))
    assert isinstance(redacted, DictConfig)
    return redacted


def _write_atomically(path: Path, text: str) -> None:
    """Replace ``path``'s content in one rename (parallel sweep jobs rewrite the same multirun.yaml)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def redact_files(paths: Iterable[Path], extra_secrets: frozenset[str] = frozenset()) -> None:
    """Rewrite the YAML files ``paths`` (those that exist) without any secret found in them."""
    loaded = {p: OmegaConf.to_container(OmegaConf.load(p), resolve=False) for p in paths if p.is_file()}
    secrets = set(extra_secrets)
    for content in loaded.values():
        overrides = [str(o) for o in content] if isinstance(content, list) else []
        secrets |= secret_values(content, overrides)
    frozen = frozenset(secrets)
    for path, content in loaded.items():
        if isinstance(content, list):  # overrides.yaml
            redacted: Any = redact_overrides([str(o) for o in content], frozen)
        else:
            redacted = redact_container(content, frozen)
        _write_atomically(path, OmegaConf.to_yaml(OmegaConf.create(redacted)))


class RedactSecretsCallback(Callback):
    """Rewrites what Hydra saved for a job (``.hydra/{config,hydra,overrides}.yaml``, and in a sweep
    the sweep directory's ``multirun.yaml``) without secrets, before the job's task runs."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra = config.hydra
        paths = []
        if hydra.output_subdir is not None:
            paths += [Path(hydra.runtime.output_dir) / str(hydra.output_subdir) / name for name in HYDRA_FILES]
        if hydra.mode == RunMode.MULTIRUN:
            paths.append(Path(str(hydra.sweep.dir)) / "multirun.yaml")
        overrides = [str(o) for o in hydra.overrides.task]
        secrets = secret_values(OmegaConf.to_container(config, resolve=False), overrides)
        if secrets:  # the files hold nothing to hide otherwise; rewriting them costs ~0.2 s
            redact_files(paths, secrets)
