"""``forge serve``: vLLM's ``serve`` flags mapped onto the config (``serve_overrides``), the settings
layered from ``--config FILE.yaml`` and ``FORGE_*`` variables (forge/server/config_sources.py) and
checked before Hydra's job starts (``check_serve_config``), then ``mode=serve`` run as ``forge run``
runs it. Part of ``forge.cli``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from forge.cli_run import compose_errors_as_config_errors, run_app
from forge.config import ConfigError
from forge.server.port_check import check_port_free

# vLLM's ``serve`` flags -> the forge setting each one sets
SERVE_FLAGS = {
    "--port": "server.port",
    "--host": "server.host",
    "--max-num-seqs": "engine.max_num_seqs",
    "--max-model-len": "engine.max_model_len",
    "--block-size": "kvcache.block_size",
    "--tensor-parallel-size": "engine.tensor_parallel_size",
    "--kv-cache-dtype": "engine.kv_cache_dtype",
    "--served-model-name": "server.served_model_name",
}
API_KEY_FLAG = "--api-key"
API_KEY_ENV = "FORGE_API_KEY"  # read by forge.server.settings; keeps the key out of every written config
# Hydra flags after which forge serve's config is not the one compose() would give (sweeps, another
# config): the early check is left to the job
HYDRA_OWN_CONFIG_FLAGS = ("-m", "--multirun", "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir")


def serve_overrides(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """Hydra overrides for ``forge serve <argv>`` and the API key given by ``--api-key`` (if any).
    A first argument without ``=`` or a leading ``-`` names the model option (``forge serve tiny``)."""
    args = list(argv)
    overrides = ["mode=serve"]
    api_key = None
    if args and "=" not in args[0] and not args[0].startswith("-"):
        overrides.append(f"model={args.pop(0)}")
    while args:
        arg = args.pop(0)
        flag, eq, inline = arg.partition("=")
        if flag in SERVE_FLAGS or flag == API_KEY_FLAG:
            if eq:
                value = inline
            elif args:
                value = args.pop(0)
            else:
                raise ConfigError(f"{flag} needs a value")
            if flag == API_KEY_FLAG:
                api_key = value
            else:
                overrides.append(f"{SERVE_FLAGS[flag]}={value}")
        elif arg.startswith("--") and "=" not in arg and arg not in ("--cfg", "--help", "--info"):
            known = ", ".join([*SERVE_FLAGS, API_KEY_FLAG])
            raise ConfigError(f"forge serve: unknown flag {arg} (the vLLM flags forge maps: {known})")
        else:
            overrides.append(arg)
    return overrides, api_key


def check_serve_config(settings: Sequence[Any], overrides: Sequence[str]) -> Any:
    """The config ``forge serve`` will run, composed and checked (``forge.config.validate_settings``)
    before Hydra's job starts: a bad setting is one line within a second, before any model, backend
    or server is imported, and before the startup line names the settings. None when the command
    line brings its own config (a sweep, another config file)."""
    if any(arg.partition("=")[0] in HYDRA_OWN_CONFIG_FLAGS for arg in overrides):
        return None
    from forge.config import validate_settings
    from forge.server.config_checks import naming_sources
    from forge.server.config_sources import compose_unchecked

    plain = [o for o in overrides if "=" in o and not o.startswith("-")]
    with compose_errors_as_config_errors():
        cfg = compose_unchecked([*(s.override for s in settings), *plain])
    try:
        validate_settings(cfg)
    except ConfigError as exc:
        raise naming_sources(exc, settings) from None
    return cfg


def serve_command(argv: Sequence[str]) -> None:
    """``--config FILE`` and the ``FORGE_*`` variables (forge/server/config_sources.py) under the flags."""
    from forge.server.config_sources import announce, layered, pop_config_flag

    args, config_file = pop_config_flag(argv)
    overrides, api_key = serve_overrides(args)
    if api_key is not None:
        os.environ[API_KEY_ENV] = api_key
    with compose_errors_as_config_errors():  # the YAML is checked against the command line's options
        settings = layered(overrides, config_file, os.environ)
    cfg = check_serve_config(settings, overrides)
    if cfg is not None:
        check_port_free(str(cfg.server.host), int(cfg.server.port))
    if settings:
        print(announce(settings), file=sys.stderr)
    run_app([*(s.override for s in settings), *overrides])
