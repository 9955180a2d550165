"""forge serve --config FILE.yaml and the FORGE_* variables: flags > environment > YAML > defaults;
FORGE_SERVER__<KEY> / FORGE_ENGINE__<KEY> for every key of those groups."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from forge.cli import main
from forge.config import EngineConfig
from forge.server.config_sources import ENV_ALIASES, ENV_GROUPS, env_settings
from forge.server.settings import ServerSettings


@pytest.fixture(autouse=True)
def no_forge_settings_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' environment starts without any variable forge serve reads."""
    for name in os.environ:
        if name in ENV_ALIASES or name.startswith(tuple(ENV_GROUPS)):
            monkeypatch.delenv(name)


def printed_config(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict, str]:
    """The config ``forge serve ARGV --cfg job`` prints (Hydra prints it and runs nothing), and stderr."""
    main(["serve", *argv, "--cfg", "job"])
    out = capsys.readouterr()
    return yaml.safe_load(out.out), out.err


def test_flags_beat_environment_beat_yaml_beat_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "server.yaml"
    settings = {
        "server": {"port": 8001, "host": "127.0.0.2", "served_model_name": "my model: v1", "api_keys": ["sk-yaml"]},
        "engine": {"max_num_seqs": 16, "max_model_len": 256},
        "scheduler": "priority",
    }
    config.write_text(yaml.safe_dump(settings))
    monkeypatch.setenv("FORGE_PORT", "7000")
    monkeypatch.setenv("FORGE_MAX_NUM_SEQS", "8")
    cfg, err = printed_config(capsys, "tiny", "--config", str(config), "--max-model-len", "128")
    assert cfg["server"]["port"] == 7000  # environment over YAML
    assert cfg["engine"]["max_num_seqs"] == 8
    assert cfg["engine"]["max_model_len"] == 128  # flag over YAML
    assert cfg["server"]["host"] == "127.0.0.2" and cfg["server"]["served_model_name"] == "my model: v1"
    assert cfg["scheduler"]["_target_"] == "forge.policies.priority.PriorityPolicy"  # an option picked by name
    assert cfg["engine"]["max_num_batched_tokens"] == 512  # untouched: the default
    assert "server.port=7000 (FORGE_PORT)" in err and f"engine.max_num_seqs=16 ({config})" not in err
    assert "sk-yaml" not in err and "server.api_keys=<redacted>" in err

    monkeypatch.setenv("FORGE_PORT", "7001")
    cfg, _ = printed_config(capsys, "--config", str(config), "--port", "9000")
    assert cfg["server"]["port"] == 9000  # flag over environment


@pytest.mark.parametrize(
    "text",
    ["server: {prot: 8001}\n", "engine: {max_num_seq: 4}\n", "colour: blue\n", "- a list\n", "server: [1\n"],
)
def test_a_yaml_forge_cannot_use_exits_2_with_one_line(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--config", str(config)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("config error: --config")


def test_every_server_and_engine_key_has_its_variable() -> None:
    keys = [f"server.{f.name}" for f in fields(ServerSettings)] + [f"engine.{f.name}" for f in fields(EngineConfig)]
    environ = {"FORGE_" + key.replace(".", "__").upper(): "null" for key in keys}
    got = {s.source: s.key for s in env_settings(environ)}
    assert got == {name: key for name, key in zip(environ, keys, strict=True)}


def test_nested_variables_are_yaml_scalars_and_beat_yaml_and_short_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(yaml.safe_dump({"server": {"port": 8001}, "engine": {"max_model_len": 256, "max_num_seqs": 4}}))
    env = {
        "FORGE_SERVER__PORT": "9000",
        "FORGE_PORT": "7000",  # the short name loses to FORGE_SERVER__PORT
        "FORGE_ENGINE__ENABLE_CHUNKED_PREFILL": "false",
        "FORGE_ENGINE__MAX_MODEL_LEN": "null",
        "FORGE_ENGINE__MAX_NUM_SEQS": "16",
        "FORGE_SERVER__SERVED_MODEL_NAME": "007: agent",  # text stays text
        "FORGE_SERVER__API_KEYS": "sk-env",  # one key: a list of it
        "FORGE_SERVER__ADMIN_KEY": "sk-admin-env",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg, err = printed_config(capsys, "tiny", "--config", str(config), "--max-num-seqs", "2")
    assert cfg["server"]["port"] == 9000
    assert cfg["engine"]["enable_chunked_prefill"] is False and cfg["engine"]["max_model_len"] is None
    assert cfg["engine"]["max_num_seqs"] == 2  # the flag over the environment
    assert cfg["server"]["served_model_name"] == "007: agent"
    assert cfg["server"]["api_keys"] == ["sk-env"] and cfg["server"]["admin_key"] == "sk-admin-env"
    assert "server.port=9000 (FORGE_SERVER__PORT)" in err and "FORGE_PORT)" not in err
    assert "sk-env" not in err and "sk-admin-env" not in err
    assert "server.admin_key=<redacted> (FORGE_SERVER__ADMIN_KEY)" in err


@pytest.mark.parametrize("name", ["FORGE_SERVER__PROT", "FORGE_ENGINE__MAX_NUM_SEQS__X", "FORGE_SERVER___TARGET_"])
def test_a_variable_naming_no_setting_exits_2_naming_it(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(name, "1")
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "tiny", "--cfg", "job"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"config error: {name}: ")
