"""workload=vidur_synthetic: Vidur's synthetic requests draw for draw (issue 35). The expected rows
were printed by Vidur's own SyntheticRequestGenerator (microsoft/vidur 7d47513, run in its venv);
the last test reruns Vidur where benchmarks/vidur_setup.sh laid it out, and skips elsewhere."""

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
from forge.workloads.vidur_synthetic import VidurSyntheticWorkload

VIDUR_VENV = Path(os.environ.get("VIDUR_VENV", "/work/vidur-venv"))
VIDUR_SRC = Path(os.environ.get("VIDUR_SRC", "/work/vidur-src"))
UNIFORM = [
    "workload.lengths.kind=uniform",
    "workload.lengths.min_tokens=256",
    "workload.lengths.max_tokens=2048",
    "workload.lengths.prefill_to_decode_ratio=4",
    "workload.arrivals.qps=5",
]
ZIPF = [
    "workload.lengths.kind=zipf",
    "workload.lengths.min_tokens=128",
    "workload.lengths.max_tokens=4096",
    "workload.lengths.theta=0.8",
    "workload.lengths.prefill_to_decode_ratio=8",
    "workload.arrivals.qps=2",
]
GAMMA = ["workload.arrivals.kind=gamma", "workload.arrivals.qps=3", "workload.arrivals.cv=2.0"]
# Vidur's --synthetic_request_generator_config_num_requests=5 with the same settings: (arrived_at, prefill, decode)
VIDUR = {
    "uniform": (
        UNIFORM,
        [
            (0.2040120574549602, 239, 61),
            (0.26833687026995334, 523, 132),
            (0.5350554048315699, 1174, 294),
            (0.980513024741846, 328, 83),
            (1.0901222566211441, 247, 62),
        ],
    ),
    "zipf": (
        ZIPF,
        [
            (0.5100301436374005, 210, 26),
            (0.5226945631587699, 2984, 373),
            (0.6835065951962527, 1136, 142),
            (0.8097996880313094, 594, 74),
            (1.4765960244353509, 123, 15),
        ],
    ),
    "gamma": (
        GAMMA,
        [
            (0.026238083658368057, 2048, 512),
            (0.4090352229201026, 2048, 512),
            (0.409825254939083, 2048, 512),
            (0.4098404307953381, 2048, 512),
            (0.5839285093249624, 2048, 512),
        ],
    ),
}


def workload(overrides: list[str], n: int = 5) -> VidurSyntheticWorkload:
    cfg = compose_config(["workload=vidur_synthetic", f"workload.num_requests={n}", *overrides])
    w = instantiate(cfg.workload)
    assert isinstance(w, VidurSyntheticWorkload)
    return w


@pytest.mark.parametrize("case", sorted(VIDUR))
def test_the_requests_are_vidurs_draw_for_draw(case: str) -> None:
    overrides, expected = VIDUR[case]
    assert workload(overrides).draws() == expected
    specs = workload(overrides).requests(ByteTokenizer())
    assert [(s.arrival_time, len(s.prompt_token_ids), s.output_len) for s in specs] == expected


def test_static_arrivals_come_at_zero_and_the_engine_runs_them() -> None:
    assert {t for t, *_ in workload(["workload.arrivals.kind=static"]).draws()} == {0.0}
    base = ["model=synthetic", "clock=simulated", "engine.max_model_len=4096", "workload=vidur_synthetic"]
    cfg = compose_config([*base, "workload.num_requests=4", *ZIPF, "progress=false", "report=false"])
    engine = build_engine(cfg)
    engine.run(workload_requests(cfg, engine))
    summary = engine.recorder.summary(dict(engine.scheduler.kv.stats()))
    assert summary["num_requests"] == 4


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("workload.lengths.theta=0", r"workload.lengths.theta \(Zipf exponent\) must be > 0 and != 1, got 0"),
        ("workload.lengths.theta=-1.5", "Zipf exponent"),
        ("workload.lengths.theta=1", "Zipf exponent"),
        ("workload.lengths.prefill_to_decode_ratio=0", r"prefill_to_decode_ratio \(P:D\) must be a finite number > 0"),
        ("workload.lengths.prefill_to_decode_ratio=-2", r"\(P:D\)"),
        ("workload.lengths.kind=lognormal", "workload.lengths.kind must be one of"),
        ("workload.arrivals.qps=0", "workload.arrivals.qps must be a finite number > 0"),
        ("workload.arrivals.cv=-1", "workload.arrivals.cv must be"),
        ("workload.lengths.min_tokens=5000", "1 <= min_tokens <= max_tokens"),
    ],
)
def test_bad_settings_are_one_line_errors(override: str, message: str) -> None:
    cfg = compose_config(["model=synthetic", "clock=simulated", "workload=vidur_synthetic", override])
    with pytest.raises(ConfigError, match=message) as info:
        workload_requests(cfg, build_engine(cfg))
    assert "\n" not in str(info.value).strip()


def test_a_draw_with_no_output_token_is_named() -> None:
    # a 1-token total at P:D 20 leaves 0.05 decode tokens: Vidur's int() makes it 0
    w = workload(["workload.lengths.kind=zipf", "workload.lengths.min_tokens=1", "workload.lengths.max_tokens=4"])
    with pytest.raises(ValueError, match=r"workload.lengths drew req-000000 with \d+ prompt and 0 output tokens"):
        w.requests(ByteTokenizer())


VIDUR_GEN = """
import json, os, sys
sys.path.insert(0, os.getcwd())
from vidur.config import SimulationConfig
from vidur.request_generator import RequestGeneratorRegistry
from vidur.utils.random import set_seeds
sys.argv = ["vidur", *json.loads(sys.argv[1]), "--metrics_config_output_dir=" + sys.argv[2]]
c = SimulationConfig.create_from_cli_args()
set_seeds(c.seed)
g = RequestGeneratorRegistry.get(c.request_generator_config.get_type(), c.request_generator_config)
print(json.dumps([[r.arrived_at, r.num_prefill_tokens, r.num_decode_tokens] for r in g.generate()]))
"""


@pytest.mark.skipif(
    not (VIDUR_VENV / "bin/python").is_file() or not (VIDUR_SRC / "vidur/request_generator").is_dir(),
    reason="Vidur is not laid out here (benchmarks/vidur_setup.sh)",
)
def test_vidur_itself_draws_the_same_200_requests(tmp_path: Path) -> None:
    flags = [
        "--synthetic_request_generator_config_num_requests=200",
        "--length_generator_config_type=zipf",
        "--zipf_request_length_generator_config_theta=0.9",
        "--zipf_request_length_generator_config_min_tokens=64",
        "--zipf_request_length_generator_config_prefill_to_decode_ratio=3",
        "--interval_generator_config_type=gamma",
        "--gamma_request_interval_generator_config_qps=7",
        "--gamma_request_interval_generator_config_cv=0.7",
    ]
    cmd = [str(VIDUR_VENV / "bin/python"), "-c", VIDUR_GEN, json.dumps(flags), str(tmp_path)]
    out = subprocess.run(cmd, cwd=VIDUR_SRC, capture_output=True, text=True, check=True, timeout=300).stdout
    vidur = [tuple(row) for row in json.loads(out.strip().splitlines()[-1])]
    ours = ["workload.lengths.kind=zipf", "workload.lengths.theta=0.9", "workload.lengths.min_tokens=64"]
    ours += ["workload.lengths.prefill_to_decode_ratio=3", *GAMMA[:1], "workload.arrivals.qps=7"]
    ours += ["workload.arrivals.cv=0.7"]
    assert workload(ours, 200).draws() == vidur


@pytest.mark.skipif(
    not (VIDUR_VENV / "bin/python").is_file() or not (VIDUR_SRC / "vidur/request_generator").is_dir(),
    reason="Vidur is not laid out here (benchmarks/vidur_setup.sh)",
)
def test_vidurs_poisson_arrivals_at_qps_10_are_both_workloads_bit_for_bit(tmp_path: Path) -> None:
    flags = [
        "--synthetic_request_generator_config_num_requests=2000",
        "--poisson_request_interval_generator_config_qps=10",
    ]
    cmd = [str(VIDUR_VENV / "bin/python"), "-c", VIDUR_GEN, json.dumps(flags), str(tmp_path)]
    out = subprocess.run(cmd, cwd=VIDUR_SRC, capture_output=True, text=True, check=True, timeout=300).stdout
    vidur = [row[0] for row in json.loads(out.strip().splitlines()[-1])]
    assert [t for t, *_ in workload(["workload.arrivals.qps=10"], 2000).draws()] == vidur
    cfg = compose_config(["workload=vidur_poisson", "workload.num_requests=2000", "workload.arrivals.rate=10"])
    assert [s.arrival_time for s in instantiate(cfg.workload).requests(ByteTokenizer())] == vidur
