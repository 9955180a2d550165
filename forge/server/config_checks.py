"""Checks of the settings ``forge serve`` read from its YAML and its environment
(forge/server/config_sources.py): no ``${...}`` interpolation, each value of its setting's declared
type, and an error about a setting named with where it came from."""

from __future__ import annotations

import re
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from forge.config import ConfigError, EngineConfig
from forge.core.config_types import shown, type_problem
from forge.results.redact import SECRET_FIELDS

if TYPE_CHECKING:
    from forge.server.config_sources import Setting

INTERPOLATION = "${"


def setting_hints() -> dict[str, Any]:
    """The declared type of every ``server.*`` and ``engine.*`` setting."""
    from forge.server.settings import ServerSettings

    hints = {f"server.{k}": v for k, v in typing.get_type_hints(ServerSettings).items()}
    return hints | {f"engine.{k}": v for k, v in typing.get_type_hints(EngineConfig).items()}


def _has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return INTERPOLATION in value
    if isinstance(value, list):
        return any(_has_interpolation(v) for v in value)
    if isinstance(value, dict):
        return any(_has_interpolation(k) or _has_interpolation(v) for k, v in value.items())
    return False


def check_settings(settings: Sequence[Setting]) -> None:
    """Each setting's value: no ``${...}`` interpolation, and the type its setting declares."""
    hints = setting_hints()
    for s in settings:
        if _has_interpolation(s.raw):
            raise ConfigError(
                f"{s.source}: {s.key}: a ${{...}} interpolation is not resolved from a config file or a "
                "variable (write the value itself; forge reads only its FORGE_* variables from the environment)"
            )
        problem = type_problem(hints.get(s.key), s.raw)
        if problem is not None:
            secret = s.key.rsplit(".", 1)[-1] in SECRET_FIELDS
            raise ConfigError(f"{s.source}: {s.key}={shown(s.raw, secret)}: {problem}")


def naming_sources(exc: ConfigError, settings: Sequence[Setting]) -> ConfigError:
    """``exc`` with the source of each setting it names (``(from FORGE_SERVER__PORT)``)."""
    text = str(exc)
    named = [s.source for s in settings if re.search(rf"(?<![\w.]){re.escape(s.key)}(?![\w.])", text)]
    return ConfigError(f"{text} (from {', '.join(dict.fromkeys(named))})") if named else exc
