"""workload=vidur_trace: a Vidur trace CSV replayed as Vidur's TraceReplayRequestGenerator reads it
(issue 35); a file missing one of Vidur's columns is a one-line config error. Where Vidur is laid out,
its own generator reads the same file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hydra.utils import instantiate

from forge.config import ConfigError, compose_config
from forge.engine.build import build_engine, workload_requests
from forge.tokenizers.base import ByteTokenizer

VIDUR_VENV = Path(os.environ.get("VIDUR_VENV", "/work/vidur-venv"))
VIDUR_SRC = Path(os.environ.get("VIDUR_SRC", "/work/vidur-src"))
TRACE = """arrived_at,num_prefill_tokens,num_decode_tokens,other
0.5,100,20,x
0.25,3,0,y
1.75,4000,300,z
2.0,57,9,w
"""


def trace(tmp_path: Path, text: str = TRACE) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def rows(path: Path, *extra: str) -> list[tuple[float, int, int]]:
    cfg = compose_config(["workload=vidur_trace", f"workload.path={path}", *extra])
    return [
        (s.arrival_time, len(s.prompt_token_ids), s.output_len)
        for s in instantiate(cfg.workload).requests(ByteTokenizer())
    ]


def test_the_trace_is_read_as_vidur_reads_it(tmp_path: Path) -> None:
    path = trace(tmp_path)
    # decode 0 -> 1; 4,000 + 300 > 4,096: the prompt loses 204; the file's order is kept
    assert rows(path) == [(0.5, 100, 20), (0.25, 3, 1), (1.75, 3796, 300), (2.0, 57, 9)]
    scaled = rows(
        path, "workload.prefill_scale_factor=0.5", "workload.decode_scale_factor=1.5", "workload.time_scale_factor=2"
    )
    # 3 * 0.5 = 1.5 -> 1; 57 * 0.5 -> 28; 9 * 1.5 = 13.5 -> 13; 0 * 1.5 -> 0 -> 1
    assert scaled == [(1.0, 50, 30), (0.5, 1, 1), (3.5, 2000, 450), (4.0, 28, 13)]
    assert rows(path, "workload.max_tokens=400") == [(0.5, 100, 20), (0.25, 3, 1), (1.75, 100, 300), (2.0, 57, 9)]


def test_a_run_replays_the_trace(tmp_path: Path) -> None:
    path = trace(tmp_path, TRACE.replace("4000,300", "400,30"))
    base = ["model=synthetic", "clock=simulated", "workload=vidur_trace", f"workload.path={path}"]
    cfg = compose_config([*base, "progress=false", "report=false"])
    engine = build_engine(cfg)
    engine.run(workload_requests(cfg, engine))
    cols = engine.recorder.request_columns()
    assert sorted(cols["num_output_tokens"]) == [1, 9, 20, 30]
    assert sorted(cols["arrival_time"].tolist()) == [0.25, 0.5, 1.75, 2.0]


@pytest.mark.parametrize(
    ("text", "extra", "message"),
    [
        ("arrived_at,num_prefill_tokens\n0,5\n", [], r"is not a Vidur trace: missing columns \['num_decode_tokens'\]"),
        ("time,num_prefill_tokens,num_decode_tokens\n0,5,5\n", [], r"missing columns \['arrived_at'\]"),
        (TRACE, ["workload.max_tokens=20"], r"row 1: 20 output tokens leave no prompt within max_tokens=20"),
        (TRACE.replace("0.5,100", "-1,100"), [], "row 1: negative arrived_at -1.0"),
        (TRACE, ["workload.time_scale_factor=0"], "workload.time_scale_factor must be > 0"),
    ],
)
def test_bad_traces_and_settings_are_one_line_errors(tmp_path: Path, text: str, extra: list[str], message: str) -> None:
    cfg = compose_config(["model=synthetic", "workload=vidur_trace", f"workload.path={trace(tmp_path, text)}", *extra])
    with pytest.raises(ConfigError, match=message) as info:
        workload_requests(cfg, build_engine(cfg))
    assert "\n" not in str(info.value).strip()


VIDUR_TRACE = """
import json, os, sys
sys.path.insert(0, os.getcwd())
from vidur.config import TraceRequestGeneratorConfig
from vidur.request_generator.trace_replay_request_generator import TraceReplayRequestGenerator
c = TraceRequestGeneratorConfig(trace_file=sys.argv[1], prefill_scale_factor=0.7, decode_scale_factor=1.3,
                                time_scale_factor=0.4, max_tokens=2048)
print(json.dumps([[r.arrived_at, int(r.num_prefill_tokens), int(r.num_decode_tokens)]
                  for r in TraceReplayRequestGenerator(c).generate()]))
"""


@pytest.mark.skipif(
    not (VIDUR_VENV / "bin/python").is_file() or not (VIDUR_SRC / "vidur/request_generator").is_dir(),
    reason="Vidur is not laid out here (benchmarks/vidur_setup.sh)",
)
def test_vidurs_own_generator_reads_the_same_requests(tmp_path: Path) -> None:
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{0.1 * i + 0.013 * i * i},{37 * i % 3000 + 1},{(53 * i) % 700}" for i in range(300)]
    path = trace(tmp_path, "\n".join(lines) + "\n")
    cmd = [str(VIDUR_VENV / "bin/python"), "-c", VIDUR_TRACE, str(path)]
    out = subprocess.run(cmd, cwd=VIDUR_SRC, capture_output=True, text=True, check=True, timeout=300).stdout
    vidur = [tuple(r) for r in json.loads(out.strip().splitlines()[-1])]
    extra = ["workload.prefill_scale_factor=0.7", "workload.decode_scale_factor=1.3", "workload.time_scale_factor=0.4"]
    assert rows(path, *extra, "workload.max_tokens=2048") == vidur
