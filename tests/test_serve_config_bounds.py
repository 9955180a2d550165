"""Hostile and unlucky configs for ``forge serve`` (issue 40): every one is a single ``config error: ...``
line on stderr, exit status 2, within 1 s, no traceback, no server started — through the command line,
from ``--config FILE`` and from the ``FORGE_*`` variables.

"Within 1 s" is measured as the CPU time the command used (user + system): the wall time of a
process on a loaded machine says more about the machine than about the command (here, with a load of
10 on 2 cores, ``python -c pass`` alone takes 0.5 s of wall time). The wall time is bounded too, by
the 10 s timeout."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from forge.cli import main
from forge.server.config_sources import ENV_ALIASES, ENV_GROUPS
from forge.server.config_yaml import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_NODES

ROOT = Path(__file__).resolve().parent.parent
MEMORY_CAP = 3 << 30  # a child that tried to expand a YAML bomb fails here instead of taking the machine


def _anchor_bomb() -> str:
    """Nine levels of maps, each holding eight aliases of the one before: 8^8 leaves once expanded."""
    lines = ["  a0: &a0 {x: 1}"]
    for i in range(1, 9):
        lines.append(f"  a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(8)) + "}")
    return "not_a_setting:\n" + "\n".join(lines) + "\n"


def _alias_bomb_list() -> str:
    """A flow list of eleven anchored lists, each of nine aliases of the one before: 9^11 once expanded."""
    levels = ["&a1 [" + ", ".join(["x"] * 9) + "]"]
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(2, 12)]
    return "[" + ", ".join(levels) + "]"


@dataclass(frozen=True)
class Case:
    """``yaml``: the ``--config`` file's text (or bytes); ``config``: a path given instead (``{tmp}`` is
    the test's directory); ``env``: variables set; ``args``: more ``forge serve`` arguments;
    ``message``: fragments the one line holds."""

    yaml: str | bytes | None = None
    config: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    message: tuple[str, ...] = ()


CASES = {
    "anchor-bomb-under-unknown-key": Case(yaml=_anchor_bomb(), message=("values once its aliases are expanded",)),
    "recursive-alias": Case(yaml="server:\n  api_keys: &a [*a]\n", message=("alias *a inside its own anchor",)),
    "too-many-values": Case(
        yaml="server:\n  api_keys: [" + ", ".join(f"sk-{i}" for i in range(MAX_NODES)) + "]\n",
        message=(f"holds more than {MAX_NODES} values",),
    ),
    "largest-list-then-a-bad-size": Case(  # refused only once composed: the whole list went through Hydra
        yaml="server:\n  max_body_bytes: 0\n  api_keys: [" + ", ".join(f"sk-{i}" for i in range(MAX_NODES - 9)) + "]\n",
        message=("server.max_body_bytes must be >= 1, got 0",),
    ),
    "longest-text-then-a-bad-size": Case(
        yaml="server:\n  max_body_bytes: 0\n  served_model_name: " + "a" * (MAX_CONFIG_BYTES - 60) + "\n",
        message=("server.max_body_bytes must be >= 1, got 0",),
    ),
    "int-of-5000-digits": Case(yaml="server:\n  port: " + "9" * 5000 + "\n", message=("more than 64 bits",)),
    "hex-int-of-5000-digits-env": Case(
        env={"FORGE_SERVER__MAX_WAITING": "0x" + "f" * 5000}, message=("FORGE_SERVER__MAX_WAITING", "64 bits")
    ),
    "dev-zero": Case(config="/dev/zero", message=("/dev/zero: not a regular file",)),
    "fifo": Case(config="{tmp}/fifo", message=("fifo: not a regular file",)),
    "directory": Case(config="{tmp}", message=("not a regular file",)),
    "missing-file": Case(config="{tmp}/absent.yaml", message=("absent.yaml: cannot open it",)),
    "too-large": Case(yaml="#" * (MAX_CONFIG_BYTES + 1), message=(f"larger than {MAX_CONFIG_BYTES} bytes",)),
    "not-utf8": Case(yaml=b"server: {host: \xff}\n", message=("not UTF-8",)),
    "nested-lists-5000": Case(
        yaml="server: " + "[" * 5000 + "]" * 5000 + "\n", message=(f"nests deeper than {MAX_DEPTH} levels",)
    ),
    "nested-maps-5000": Case(
        yaml="server: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", message=(f"nests deeper than {MAX_DEPTH}",)
    ),
    "duplicate-key": Case(yaml="server:\n  port: 8001\n  port: 8002\n", message=("duplicate key 'port'", "line 3")),
    "duplicate-top-key": Case(yaml="server: {port: 8001}\nserver: {host: x}\n", message=("duplicate key 'server'",)),
    "api-keys-a-string": Case(
        yaml="server:\n  api_keys: sk-secret-1\n", message=("server.api_keys", "expected a list of text")
    ),
    "port-quoted": Case(yaml="server: {port: '8001'}\n", message=("server.port='8001': expected an integer",)),
    "bool-as-int": Case(
        yaml="engine: {enable_chunked_prefill: 3}\n", message=("engine.enable_chunked_prefill=3: expected true",)
    ),
    "port-a-bool": Case(yaml="server: {port: true}\n", message=("server.port=True: expected an integer",)),
    "interpolation-in-yaml": Case(
        yaml="server:\n  served_model_name: ${oc.env:HOME}\n", message=("server.served_model_name", "interpolation")
    ),
    "interpolation-in-env": Case(
        env={"FORGE_SERVER__SERVED_MODEL_NAME": "${oc.env:HOME}"},
        message=("FORGE_SERVER__SERVED_MODEL_NAME", "interpolation"),
    ),
    "interpolation-in-list": Case(yaml="server: {api_keys: ['${oc.env:PATH}']}\n", message=("interpolation",)),
    "port-abc-env": Case(env={"FORGE_SERVER__PORT": "abc"}, message=("FORGE_SERVER__PORT", "expected an integer")),
    "port-abc-alias": Case(env={"FORGE_PORT": "abc"}, message=("FORGE_PORT", "expected an integer")),
    "max-body-negative-env": Case(
        env={"FORGE_SERVER__MAX_BODY_BYTES": "-1"},
        message=("server.max_body_bytes must be >= 1, got -1", "FORGE_SERVER__MAX_BODY_BYTES"),
    ),
    "max-logprobs-negative": Case(yaml="server: {max_logprobs: -1}\n", message=("server.max_logprobs",)),
    "rate-nan": Case(yaml="server: {rate_limit_rps: .nan}\n", message=("server.rate_limit_rps",)),
    "log-level-unknown": Case(env={"FORGE_SERVER__LOG_LEVEL": "LOUD"}, message=("server.log_level",)),
    "engine-size-negative": Case(yaml="engine: {max_num_seqs: -1}\n", message=("engine.max_num_seqs must be >= 1",)),
    "env-nested-5000": Case(env={"FORGE_SERVER__API_KEYS": "[" * 5000}, message=("FORGE_SERVER__API_KEYS", "nests")),
    "env-alias-bomb": Case(
        env={"FORGE_SERVER__API_KEYS": _alias_bomb_list()},
        message=("FORGE_SERVER__API_KEYS", "values once its aliases are expanded"),
    ),
    "model-option-traversal": Case(
        yaml="model: ../../../etc/passwd\n", message=("model='../../../etc/passwd': not a model option", "tiny")
    ),
    "model-option-traversal-env": Case(
        env={"FORGE_MODEL": "../../etc/passwd"}, message=("FORGE_MODEL", "not a model option")
    ),
    "model-path-not-gguf": Case(
        yaml="model: {path: /etc/passwd}\n", args=("gguf",), message=("model.path='/etc/passwd'", "not a GGUF file")
    ),
    "model-path-traversal-missing": Case(
        yaml="model: {path: ../../../no/such/model.gguf}\n", args=("gguf",), message=("no such file",)
    ),
    "model-path-device": Case(args=("model=gguf", "model.path=/dev/zero"), message=("not a GGUF file",)),
    "safetensors-path-a-file": Case(
        yaml="model: {path: /etc/passwd}\n", args=("safetensors",), message=("not a model directory",)
    ),
    "unknown-option-beside-a-config": Case(
        yaml="server: {port: 8001}\n", args=("scheduler=fcsf",), message=("scheduler=fcsf: no such option",)
    ),
    "odd-key": Case(yaml="server:\n  'port=1,host': 2\n", message=("not a setting",)),
    "key-not-text": Case(yaml="server:\n  8001: port\n", message=("not a setting",)),
}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    drop = ("HYDRA_FULL_ERROR", "FORGE_FULL_ERROR", "FORGE_API_KEY", "FORGE_ADMIN_KEY")
    env = {k: v for k, v in os.environ.items() if k not in drop and k not in ENV_ALIASES}
    env = {k: v for k, v in env.items() if not k.startswith(tuple(ENV_GROUPS))}
    return {**env, **extra}


def _config_arg(case: Case, tmp_path: Path) -> list[str]:
    if case.yaml is not None:
        path = tmp_path / "serve.yaml"
        path.write_bytes(case.yaml if isinstance(case.yaml, bytes) else case.yaml.encode())
        return ["--config", str(path)]
    if case.config is not None:
        return ["--config", case.config.format(tmp=tmp_path)]
    return []


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_a_config_that_blows_up_is_one_line_exit_2_within_a_second(case: Case, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    argv = [sys.executable, "-m", "forge.cli", "serve", *case.args, *_config_arg(case, tmp_path), "--port", "0"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(
            argv,
            cwd=ROOT,
            env=_clean_env(case.env),
            capture_output=True,
            text=True,
            timeout=10,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"still running after 10 s (a server started?): {str(exc.stderr)[-500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: "), proc.stderr[-2000:]
    for fragment in case.message:
        assert fragment in lines[0]
    assert "sk-secret-1" not in proc.stderr
    assert cpu_s < 1.0, f"{cpu_s:.2f} s of CPU"


RUN_CASES = {
    "server-size-negative": (["mode=serve", "server.max_body_bytes=-1"], "server.max_body_bytes must be >= 1, got -1"),
    "server-keys-a-string": (["mode=serve", "server.api_keys=sk-1"], "server.api_keys='sk-1': expected a list of text"),
    "model-path-not-gguf": (["model=gguf", "model.path=/etc/passwd"], "model.path='/etc/passwd': not a GGUF file"),
    "model-option-traversal": (["model=../../../etc/passwd"], "no such option"),
}


@pytest.mark.parametrize(("overrides", "message"), RUN_CASES.values(), ids=list(RUN_CASES))
def test_forge_run_with_the_same_classes_of_override_is_one_line_exit_2_within_a_second(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    """Through Hydra's command line (``python run.py``): the checks that need no import run first."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, "run.py", *overrides, "server.port=0", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT,
        env=_clean_env({}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: ") and message in lines[0], proc.stderr
    assert cpu_s < 1.0, f"{cpu_s:.2f} s of CPU"


# -- what stays allowed ----------------------------------------------------------------------------
@pytest.fixture
def no_forge_settings_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name in ENV_ALIASES or name.startswith(tuple(ENV_GROUPS)):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("no_forge_settings_in_env")
def test_anchors_merge_keys_and_text_variables_within_the_limits_still_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {api_keys: &keys [sk-a, sk-b]}\n"
        "engine: {<<: {max_num_seqs: 8, max_model_len: 256}, max_model_len: 128}\n"
    )
    monkeypatch.setenv("FORGE_SERVER__ADMIN_KEY", "1234")  # digits stay text
    monkeypatch.setenv("FORGE_SERVER__SERVED_MODEL_NAME", "null")  # null is still null
    main(["serve", "tiny", "--config", str(config), "--cfg", "job"])
    out = capsys.readouterr()
    cfg = yaml.safe_load(out.out)
    assert cfg["server"]["api_keys"] == ["sk-a", "sk-b"] and cfg["server"]["admin_key"] == "1234"
    assert cfg["engine"]["max_num_seqs"] == 8 and cfg["engine"]["max_model_len"] == 128
    assert cfg["server"]["served_model_name"] is None
