"""Bad configuration and bad model files fail early with a message naming the setting or the tensor;
``python run.py`` prints such an error as one line (exit status 2)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGUFReader, ReaderTensor

from forge import SamplingParams
from forge.config import ConfigError, compose_config
from forge.core.request import Request
from forge.engine.build import build_engine
from forge.models.gguf_file import GGUFError
from forge.models.gguf_loader import load_gguf
from tests.gguf_fixtures import write_tiny_gguf

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("engine.max_num_seqs=0", "engine.max_num_seqs"),
        ("engine.max_num_batched_tokens=-5", "engine.max_num_batched_tokens"),
        ("engine.max_model_len=0", "engine.max_model_len"),
        ("engine.kv_cache_memory_gib=-1", "engine.kv_cache_memory_gib"),
        ("engine.kv_cache_memory_gib=nan", "engine.kv_cache_memory_gib"),
        ("engine.kv_cache_memory_gib=inf", "engine.kv_cache_memory_gib"),
    ],
)
def test_negative_engine_sizes(override: str, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        compose_config([override])


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["kvcache.num_blocks=-3"], "kvcache.num_blocks"),
        (["kvcache.block_size=0"], "kvcache.block_size"),
        (["kvcache=naive", "kvcache.reservation=maybe"], "kvcache.reservation"),
        (["workload.num_requests=0"], "workload.num_requests"),
        (["workload.arrivals.rate=-1"], "rate"),
        (["workload.input_len.low=0"], "workload uniform lengths"),
    ],
)
def test_bad_component_settings(overrides: list[str], names: str) -> None:
    from forge.engine.build import workload_requests

    with pytest.raises(ValueError, match=names):
        cfg = compose_config(overrides)
        engine = build_engine(cfg)
        workload_requests(cfg, engine)


def test_prompt_longer_than_max_model_len() -> None:
    engine = build_engine(compose_config(["model=synthetic", "engine.max_model_len=64"]))
    with pytest.raises(ValueError, match="max_model_len=64"):
        engine.add_request(Request("long", [65] * 100, SamplingParams(max_tokens=4)))


def test_pool_too_small_for_one_request() -> None:
    engine = build_engine(compose_config(["model=synthetic", "kvcache.num_blocks=2", "kvcache.block_size=16"]))
    with pytest.raises(ValueError, match="kvcache.num_blocks=2"):
        engine.add_request(Request("big", [65] * 40, SamplingParams(max_tokens=4)))


def test_naive_max_reservation_larger_than_pool() -> None:
    """Each request of kvcache=naive reserves max_model_len (2048) tokens: a pool of 128 is refused at
    add_request, as a paged pool too small for the request is, not at the step that cannot admit it."""
    engine = build_engine(
        compose_config(["model=synthetic", "kvcache=naive", "kvcache.num_blocks=8", "kvcache.block_size=16"])
    )
    with pytest.raises(ValueError, match="may need 2048 tokens of KV but the whole cache holds 128"):
        engine.add_request(Request("r", [65] * 20, SamplingParams(max_tokens=4)))


def test_missing_required_setting_is_named() -> None:
    with pytest.raises(ConfigError, match="must be set"):
        compose_config(["workload.arrivals.rate=???"])


def test_bad_sampling_params() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


@pytest.mark.parametrize("override", ["+engine.foo=1", "+foo=1", "+engine.max_num_seq=4"])
def test_added_unknown_key_is_rejected(override: str) -> None:
    key = override.lstrip("+").split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: not a setting"):
        compose_config(["model=synthetic", override])


def test_max_model_len_above_the_models_is_rejected_naming_both() -> None:
    cfg = compose_config(["model=synthetic", "model.max_position=1024", "engine.max_model_len=4096"])
    with pytest.raises(ConfigError, match=r"engine\.max_model_len=4096 exceeds the model's context length of 1024"):
        build_engine(cfg)


@pytest.mark.parametrize(("overrides", "expected"), [([], 1024), (["engine.max_model_len=1024"], 1024)])
def test_max_model_len_within_the_models(overrides: list[str], expected: int) -> None:
    """Unset, it is 2048 capped at the model's context length (as before); equal to it is fine."""
    engine = build_engine(compose_config(["model=synthetic", "model.max_position=1024", *overrides]))
    assert engine.scheduler.limits.max_model_len == expected


@pytest.mark.parametrize("overrides", [["model.dtype=int8"], ["drafter=draft_model", "drafter.model.dtype=int8"]])
def test_non_float_model_dtype_is_refused_at_compose_time(overrides: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"dtype='int8': not a model dtype \(valid: float64, float32, bfloat16"):
        compose_config(overrides)


def _run_py(*overrides: str, run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "run.py", "progress=false", "report=false", *overrides, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=synthetic", "+engine.foo=1"], "engine.foo: not a setting"),
        (["model=synthetic", "kvcache.num_blocks=-3"], "kvcache.num_blocks must be >= 1, got -3"),
        (["model=tiny", "engine.max_model_len=8192"], "engine.max_model_len=8192 exceeds"),
        (
            ["model=synthetic", "sampling.temperature=-1"],
            "sampling: temperature must be 0 or finite and in [0.01, 100.0], got -1",
        ),
    ],
)
def test_run_py_prints_a_config_error_as_one_line(overrides: list[str], message: str, tmp_path: Path) -> None:
    proc = _run_py(*overrides, run_dir=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: ") and message in lines[0], proc.stderr


def _tiny_gguf(tmp_path: Path) -> tuple[Path, bytes, list[ReaderTensor]]:
    path = tmp_path / "model.gguf"
    write_tiny_gguf(path)
    return path, path.read_bytes(), list(GGUFReader(str(path)).tensors)


def test_gguf_truncated_inside_a_tensor_names_it_and_the_byte_range(tmp_path: Path) -> None:
    path, data, tensors = _tiny_gguf(tmp_path)
    victim = tensors[len(tensors) // 2]
    begin, end = victim.data_offset, victim.data_offset + victim.n_bytes
    cut = begin + victim.n_bytes // 2
    path.write_bytes(data[:cut])
    with pytest.raises(GGUFError) as info:
        load_gguf(str(path))
    first_beyond = next(t for t in tensors if t.data_offset + t.n_bytes > cut)
    assert first_beyond.name == victim.name
    assert str(info.value) == (
        f"{path}: truncated: tensor {victim.name!r} needs bytes [{begin}, {end}) but the file has {cut}"
    )


def test_gguf_truncated_inside_the_header_says_truncated(tmp_path: Path) -> None:
    path, data, _ = _tiny_gguf(tmp_path)
    path.write_bytes(data[:5000])
    header_cut = r"model\.gguf: truncated: the header needs bytes \[\d+, \d+\) but the file has 5000"
    with pytest.raises(GGUFError, match=header_cut):
        load_gguf(str(path))


def test_gguf_with_non_finite_weights_names_the_tensor(tmp_path: Path) -> None:
    path, data, tensors = _tiny_gguf(tmp_path)
    victim = tensors[len(tensors) // 2]
    start = victim.data_offset + 64
    path.write_bytes(data[:start] + b"\xff" * 4096 + data[start + 4096 :])
    with pytest.raises(GGUFError, match=rf"tensor {re.escape(repr(victim.name))} holds non-finite values"):
        load_gguf(str(path))


def test_run_py_reports_a_truncated_gguf_as_a_config_error(tmp_path: Path) -> None:
    path, data, tensors = _tiny_gguf(tmp_path)
    path.write_bytes(data[: len(data) - 100])
    proc = _run_py("model=gguf", f"model.path={path}", "workload.num_requests=1", run_dir=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == (
        f"config error: model: {path}: truncated: tensor {tensors[-1].name!r} needs bytes "
        f"[{tensors[-1].data_offset}, {len(data)}) but the file has {len(data) - 100}"
    )


# -- checks made from the config alone run before anything is loaded (issue 23) -----------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["kvcache.block_size=-4"], "kvcache.block_size must be an integer >= 1, got -4"),
        (["kvcache=naive", "kvcache.block_size=0"], "kvcache.block_size must be an integer >= 1, got 0"),
        (["kvcache.num_blocks=0"], "kvcache.num_blocks must be >= 1, got 0 (or auto: sized from memory)"),
        (["kvcache.num_cpu_blocks=-1"], "kvcache.num_cpu_blocks must be null or an integer >= 0, got -1"),
        (["clock=simulated", "clock.model=llama-9"], "clock.model='llama-9': not a model preset (valid: auto, "),
    ],
)
def test_config_alone_errors_are_found_at_compose_time(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    assert str(info.value).startswith(message)


def test_a_bad_pool_size_is_reported_before_the_model_is_loaded(tmp_path: Path) -> None:
    """The model file does not exist: had the model been loaded first, that would be the error."""
    missing = tmp_path / "absent.gguf"
    proc = _run_py("model=gguf", f"model.path={missing}", "kvcache.block_size=-4", run_dir=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == "config error: kvcache.block_size must be an integer >= 1, got -4"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["model=synthetic", "kvcache.num_blocks=2"],
            "config error: workload: request req-000000 may need 254 tokens of KV but the whole cache holds 32 "
            "(kvcache.num_blocks=2 x block_size=16)",
        ),
        (["model=synthetic", "clock=simulated", "clock.model=llama-9"], "config error: clock.model='llama-9'"),
        (  # a naive cache reserves max_model_len per request: the whole pool of 112 cannot
            ["model=synthetic", "kvcache=naive", "kvcache.num_blocks=112", "kvcache.block_size=1"],
            "config error: workload: request req-000000 may need 2048 tokens of KV but the whole cache holds 112",
        ),
        (  # reservation=pow2: 60 + 5 tokens reserve 128 slots, more than the pool's 112
            [
                "model=synthetic",
                "kvcache=naive",
                "kvcache.reservation=pow2",
                "kvcache.num_blocks=7",
                "workload=fixed",
                "workload.input_len.value=60",
                "workload.output_len.value=5",
            ],
            "config error: workload: request req-000000 may need 128 tokens of KV but the whole cache holds 112",
        ),
        (  # sarathi's budget (chunk_size) below the prompt, whole prompts only: the run used to spin forever
            [
                "model=synthetic",
                "clock=simulated",
                "scheduler=sarathi",
                "scheduler.chunk_size=64",
                "engine.enable_chunked_prefill=false",
                "engine.max_num_batched_tokens=2048",
            ],
            "config error: scheduler Sarathi's token budget of 64 (of engine.max_num_batched_tokens=2048) < "
            "max_model_len=2048 needs engine.enable_chunked_prefill=true",
        ),
    ],
)
def test_run_py_reports_a_pool_too_small_or_an_unknown_preset_in_one_line(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    proc = _run_py(*overrides, "workload.num_requests=2", run_dir=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith(message), proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_run_py_says_in_one_line_that_backend_cuda_needs_cuda(tmp_path: Path) -> None:
    proc = _run_py("model=synthetic", "backend=cuda", run_dir=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: backend: backend=cuda cannot run on this machine")
    assert "backend=torch" in lines[0]


def test_full_error_switch_shows_the_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "run.py", "kvcache.block_size=-4", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FORGE_FULL_ERROR": "1"},
    )
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ConfigError: kvcache.block_size must be" in proc.stderr


# -- Hydra's own errors (the command line itself) are one line and exit 2 too (issue 23) -------
@pytest.mark.parametrize(
    ("command", "message"),
    [
        (
            ["run.py", "scheduler=fcsf"],
            "config error: scheduler=fcsf: no such option (options: decode_first, fcfs, lpm, prefill_first, ",
        ),
        (["run.py", "kvcache.blok_size=8"], "config error: kvcache.blok_size: not a setting ("),
        (
            ["-m", "forge.cli", "run", "workload.num_requests=2=3"],
            "config error: workload.num_requests=2=3: not an override Hydra can parse (",
        ),
    ],
    ids=["unknown-option", "unknown-key", "bad-syntax"],
)
def test_hydra_command_line_errors_are_one_line_and_exit_2(command: list[str], message: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, *command, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "FORGE_FULL_ERROR")},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr


def test_hydra_full_error_still_shows_hydras_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "run.py", "scheduler=fcsf", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HYDRA_FULL_ERROR": "1"},
    )
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "MissingConfigException: In 'config': Could not find 'scheduler/fcsf'" in (
        proc.stderr
    )
