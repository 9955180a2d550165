"""API keys given on the command line never reach the run directory (issue 13 item 12)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from forge.config import compose_config
from forge.results.redact import REDACTED, redact_config, redact_overrides

ROOT = Path(__file__).resolve().parent.parent
SECRETS = ("secret-xyz", "sk-second-key")
KEYS_OVERRIDE = f"server.api_keys=[{','.join(SECRETS)}]"
QUICK = ["model=synthetic", "clock=simulated", "workload.num_requests=2", "report=false", "progress=false"]


def _files_holding_a_secret(root: Path) -> list[str]:
    return [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*"))
        if p.is_file() and any(s.encode() in p.read_bytes() for s in SECRETS)
    ]


def _run_py(*args: str) -> None:
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_run_writes_no_command_line_key(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _run_py(*QUICK, KEYS_OVERRIDE, f"hydra.run.dir={run_dir}")
    assert (run_dir / ".hydra" / "hydra.yaml").is_file() and (run_dir / "config.yaml").is_file()
    assert _files_holding_a_secret(run_dir) == []
    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    assert f"server.api_keys={REDACTED}" in overrides and "model=synthetic" in overrides
    for saved in (run_dir / "config.yaml", run_dir / ".hydra" / "config.yaml"):
        config = yaml.safe_load(saved.read_text())
        assert config["server"]["api_keys"] == [REDACTED, REDACTED]
        assert config["model"]["_target_"] == "forge.models.synthetic.SyntheticModel"


def test_a_sweep_writes_no_command_line_key(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    _run_py("-m", *QUICK, KEYS_OVERRIDE, "seed=0", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={sweep_dir}")
    assert (sweep_dir / "multirun.yaml").is_file() and (sweep_dir / "0" / ".hydra" / "hydra.yaml").is_file()
    assert (sweep_dir / "sweep_report.md").is_file()  # the report still reads the redacted overrides
    assert _files_holding_a_secret(sweep_dir) == []


def test_redact_config_replaces_keys_and_keeps_env_interpolations() -> None:
    cfg = compose_config(
        [
            "server.api_keys=[abc-123,${oc.env:FORGE_TEST_KEY}]",
            "server.admin_key=adm-456",
            "server.admin_api_keys=[all-789]",
        ]
    )
    redacted = redact_config(cfg)
    server = OmegaConf.to_container(redacted.server, resolve=False)
    assert isinstance(server, dict) and server["api_keys"] == [
        REDACTED,
        "${oc.env:FORGE_TEST_KEY}",
    ]
    assert server["admin_key"] == REDACTED and server["admin_api_keys"] == [REDACTED]
    assert redacted.engine == cfg.engine and redacted.model == cfg.model
    assert cfg.server.api_keys[0] == "abc-123"  # the running config is not touched


def test_redact_overrides_hides_secret_settings_and_scrubs_the_rest() -> None:
    overrides = ["+server.api_keys=[k1,k2]", "++server.api_key=k3", "model=synthetic", "hydra.job.name=k1-run"]
    assert redact_overrides(overrides, frozenset({"k1"})) == [
        f"+server.api_keys={REDACTED}",
        f"++server.api_key={REDACTED}",
        "model=synthetic",
        f"hydra.job.name={REDACTED}-run",
    ]
