"""``forge serve``'s settings from a YAML file and from environment variables.

Precedence, highest first: command-line flags and overrides > environment variables > the
``--config`` YAML > the defaults (``conf/``). The YAML has the config's own keys
(``server: {port: 8001}``, ``engine: {max_num_seqs: 16}``, ``model: smollm2`` to pick an option);
a key the config does not have is a config error.

The environment: ``FORGE_SERVER__<KEY>`` and ``FORGE_ENGINE__<KEY>`` set ``server.<key>`` and
``engine.<key>`` for every key of those two groups (``FORGE_SERVER__PORT=9000``; a double
underscore nests, the key is lowercased); one naming no key is a config error naming the variable.
Values are read as YAML scalars (``true``, ``16``, ``null``, ``[k1, k2]``), except that a setting
whose default is text keeps the text as given and a list setting given one value gets a list of it.
The short names of ``ENV_ALIASES`` (``FORGE_PORT``, ``FORGE_MODEL``, ...) still work; when both a
short name and its ``FORGE_SERVER__``/``FORGE_ENGINE__`` name are set, the latter wins. An empty
variable counts as unset. ``FORGE_API_KEY`` and ``FORGE_ADMIN_KEY`` are read by ``ServerSettings``
itself (never written into a config). Every setting that came from the YAML or the environment is
printed at startup with where it came from, secrets redacted.

Both are read with bounds and strictly (issue 40; the limits are forge.server.config_yaml's): the file is a
regular file of at most 256 KiB, its YAML (and a variable's) nests at most 32 deep and holds at most
1,000 values with its aliases expanded, a key given twice is an error; a ``server.*``/``engine.*`` value
must have its setting's type (forge.core.config_types: ``port: '8001'``, ``api_keys: sk-1`` or
``enable_chunked_prefill: 3`` are errors, not conversions); an option's name (``model: NAME``,
``FORGE_MODEL``) must be one of ``conf/<group>/``'s. A ``${...}`` interpolation in a value is refused,
not resolved: a config file is data, and resolving it would let the file read the environment
(``${oc.env:...}``) or any other setting behind the operator's back; the environment is read only
through the ``FORGE_*`` names above, each announced at startup."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, ListConfig, OmegaConf

from forge.config import CONF_DIR, ConfigError, register_schema
from forge.core.config_types import is_list, is_optional, is_text, shown
from forge.results.redact import REDACTED, SECRET_FIELDS
from forge.server.config_checks import check_settings, setting_hints
from forge.server.config_yaml import load_yaml_text, read_config_yaml

CONFIG_FLAG = "--config"
# the environment's prefixes -> the config group whose every key they set
ENV_GROUPS: dict[str, str] = {"FORGE_SERVER__": "server", "FORGE_ENGINE__": "engine"}
ENV_NESTING = "__"
# short environment names (the first ones forge read) -> the setting each sets
ENV_ALIASES: dict[str, str] = {
    "FORGE_HOST": "server.host",
    "FORGE_PORT": "server.port",
    "FORGE_LOG_LEVEL": "server.log_level",
    "FORGE_SERVED_MODEL_NAME": "server.served_model_name",
    "FORGE_STATE_DIR": "server.state_dir",
    "FORGE_SHUTDOWN_TIMEOUT_S": "server.shutdown_timeout_s",
    "FORGE_MODEL": "model",
    "FORGE_MAX_NUM_SEQS": "engine.max_num_seqs",
    "FORGE_MAX_MODEL_LEN": "engine.max_model_len",
}
# the config groups whose option a YAML string (``model: smollm2``) picks
GROUP_KEYS = frozenset(
    {"model", "scheduler", "kvcache", "backend", "workload", "clock", "sampling", "drafter", "structured", "server"}
)
_MISSING = object()
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class Setting:
    """One override and where it came from (an environment variable or the YAML's path); ``raw``:
    the value as read, before it became override text."""

    key: str
    value: str
    source: str
    raw: Any = field(default=None, compare=False, repr=False)

    @property
    def override(self) -> str:
        return f"{self.key}={self.value}"

    def shown(self) -> str:
        value = REDACTED if self.key.rsplit(".", 1)[-1] in SECRET_FIELDS else self.value
        return f"{self.key}={value} ({self.source})"


def pop_config_flag(argv: Sequence[str]) -> tuple[list[str], Path | None]:
    """``argv`` without ``--config FILE`` (or ``--config=FILE``), and that file."""
    args, out, path = list(argv), [], None
    while args:
        arg = args.pop(0)
        flag, eq, inline = arg.partition("=")
        if flag != CONFIG_FLAG:
            out.append(arg)
        elif eq:
            path = Path(inline)
        elif args:
            path = Path(args.pop(0))
        else:
            raise ConfigError(f"{CONFIG_FLAG} needs a YAML file")
    return out, path


def override_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (strings quoted, so any text stays a string)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, list):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str) or not key.isidentifier():
                raise ConfigError(f"{key!r}: not a setting's name (letters, digits and _)")
        return "{" + ",".join(f"{k}:{override_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"cannot use a {type(value).__name__} as a setting")


def _leaves(node: Mapping[Any, Any], prefix: str, where: str) -> list[tuple[str, Any]]:
    """``node``'s settings as ``(dotted key, value)``; a key that is not a name is refused."""
    out: list[tuple[str, Any]] = []
    for key, value in node.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ConfigError(f"{where}: {prefix}{shown(key)}: not a setting (a setting's name is letters, digits, _)")
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += _leaves(value, f"{path}.", where)
        else:
            out.append((path, value))
    return out


def options(group: str) -> list[str]:
    """The options of a config group (``conf/<group>/*.yaml``)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _choice(group: str, name: str, where: str) -> Setting:
    """``group=name`` as a setting, if ``name`` is one of the group's options."""
    if name not in options(group):
        known = ", ".join(options(group))
        raise ConfigError(f"{where}: {group}={shown(name)}: not a {group} option (options: {known})")
    return Setting(group, name, where, raw=name)


def _exists(base: DictConfig, key: str) -> bool:
    """Whether ``key`` is a setting of ``base`` (one that must still be given, ``???``, is one)."""
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(base, parent, default=None) if parent else base
    return isinstance(node, DictConfig) and last in list(node)  # "in node" is False for "???"


def yaml_settings(path: Path, cli_choices: Sequence[str] = ()) -> list[Setting]:
    """The YAML's settings, checked against the config it composes to with the command line's option
    choices (``cli_choices``: ``model=gguf``, ...): an unknown key is a ``ConfigError`` naming it."""
    where = f"{CONFIG_FLAG} {path}"
    data = read_config_yaml(path, where)
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping of settings")
    choices = [_choice(k, v, where) for k, v in data.items() if k in GROUP_KEYS and isinstance(v, str)]
    values = {k: v for k, v in data.items() if not (k in GROUP_KEYS and isinstance(v, str))}
    picked = {_key(c): c for c in [*(s.override for s in choices), *cli_choices]}
    base = _defaults(list(picked.values()))
    settings = [Setting(c.key, c.value, str(path), raw=c.raw) for c in choices]
    for key, value in _leaves(values, "", where):
        if key == "hydra" or key.startswith("hydra."):
            raise ConfigError(f"{where}: {key}: Hydra's own settings cannot be set here")
        if not _exists(base, key):
            raise ConfigError(f"{where}: {key if len(key) <= 80 else shown(key)}: not a setting")
        settings.append(Setting(key, override_value(value), str(path), raw=value))
    return settings


def env_value(text: str, hint: Any, default: Any, where: str) -> Any:
    """``text`` (an environment variable's value) as its setting's value: text as given for a text
    setting (``null`` is null where null is allowed), a list for a list setting (one value: a list of
    it), otherwise read as a YAML scalar within forge.server.config_yaml's limits."""
    if is_text(hint) or (hint is None and isinstance(default, str)):
        return None if is_optional(hint) and text in ("null", "~") else text
    if (is_list(hint) or isinstance(default, list | ListConfig)) and not text.lstrip().startswith("["):
        return [text]
    value = load_yaml_text(text, where)
    return text if isinstance(value, dict) else value


def _env_key(name: str) -> str | None:
    """The setting ``FORGE_SERVER__PORT`` names (``server.port``); None for other variables."""
    for prefix, group in ENV_GROUPS.items():
        if name.startswith(prefix):
            return ".".join([group, *name[len(prefix) :].lower().split(ENV_NESTING)])
    return None


def env_settings(environ: Mapping[str, str]) -> list[Setting]:
    """The environment's settings: the short aliases first, then the ``FORGE_SERVER__*`` and
    ``FORGE_ENGINE__*`` ones (a ``ConfigError`` names a variable that sets no key)."""
    set_vars = {name: value for name, value in environ.items() if value != ""}
    nested = {name: key for name in sorted(set_vars) if (key := _env_key(name)) is not None}
    aliased = {name: key for name, key in ENV_ALIASES.items() if name in set_vars}
    if not nested and not aliased:
        return []
    base, hints = _defaults([]), setting_hints()
    settings = []
    for name, key in [*aliased.items(), *nested.items()]:
        default = OmegaConf.select(base, key, default=_MISSING)
        last = key.rsplit(".", 1)[-1]
        if key in GROUP_KEYS:  # FORGE_MODEL: an option's name
            settings.append(_choice(key, set_vars[name], name))
            continue
        if default is _MISSING or last.startswith("_") or not last or isinstance(default, DictConfig):
            group = key.partition(".")[0]
            raise ConfigError(f"{name}: {key} is not a setting (the {group}.* keys: {', '.join(_keys(base, group))})")
        value = env_value(set_vars[name], hints.get(key), default, name)
        settings.append(Setting(key, override_value(value), name, raw=value))
    return settings


def _keys(base: DictConfig, group: str) -> list[str]:
    node = base.get(group)
    return [str(k) for k in node if not str(k).startswith("_")] if isinstance(node, DictConfig) else []


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def layered(cli: Sequence[str], config_file: Path | None, environ: Mapping[str, str]) -> list[Setting]:
    """The YAML's and the environment's settings that no command-line override sets, the
    environment's winning over the YAML's."""
    cli_choices = [o for o in cli if _key(o) in GROUP_KEYS and "=" in o]
    read = [*(yaml_settings(config_file, cli_choices) if config_file is not None else []), *env_settings(environ)]
    check_settings(read)
    chosen = {s.key: s for s in read}
    on_cli = {_key(o) for o in cli}
    return [s for key, s in chosen.items() if key not in on_cli]


def layered_overrides(cli: Sequence[str], config_file: Path | None, environ: Mapping[str, str]) -> list[str]:
    """The Hydra overrides for ``forge serve``: the layered settings, then the command line's."""
    return [*(s.override for s in layered(cli, config_file, environ)), *cli]


def announce(settings: Sequence[Setting]) -> str:
    """The startup line naming each setting the YAML or the environment gave, and its source."""
    return "forge serve: " + ", ".join(s.shown() for s in settings) if settings else ""


def compose_unchecked(overrides: Sequence[str]) -> DictConfig:
    """The config ``overrides`` compose to, unvalidated (for the checks that then run without
    importing any component: ``forge.config.validate_settings``)."""
    return _defaults(overrides)


def _defaults(choices: Sequence[str]) -> DictConfig:
    """The config the YAML's option choices compose to, unvalidated (a setting the command line
    still has to give is no reason to refuse the YAML)."""
    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(choices))
