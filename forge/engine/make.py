"""Hydra's ``instantiate`` as forge's one factory, with a bad setting reported as a ``ConfigError``."""

from __future__ import annotations

from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from forge.config import ConfigError


def make(group: str, node: Any, **kwargs: Any) -> Any:
    """``instantiate`` that reports a bad setting as a ConfigError naming the group, not a deep traceback."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__ or e
        raise ConfigError(f"{group}: {cause}") from cause
