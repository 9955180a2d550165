"""forge serve --config FILE.yaml and the FORGE_* variables: flags > environment > YAML > defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from forge.cli import main
from forge.server.config_sources import ENV_SETTINGS


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
    for name in ENV_SETTINGS:
        monkeypatch.delenv(name, raising=False)
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
