"""``cluster=disaggregated``: prefill and decode pools joined by a KV transfer over a link preset; TTFT
includes the transfer; fast paths and reruns change nothing; bad pools and links are one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from forge.cluster.run import Records, build_cluster
from forge.cluster.spec import link_preset
from forge.config import compose_config
from forge.engine.build import workload_requests

ROOT = Path(__file__).resolve().parent.parent
BASE = ["model=synthetic", "clock=simulated", "progress=false", "report=false", "cluster=disaggregated"]
TWO_TWO = ["cluster.prefill_replicas=2", "cluster.decode_replicas=2", "workload.num_requests=40"]


def run(overrides: list[str]) -> Records:
    cfg = compose_config([*BASE, *overrides])
    cluster = build_cluster(cfg)
    return cluster.run(workload_requests(cfg, cluster.first), False)


def test_each_request_is_prefilled_then_decoded_after_its_kv_arrives() -> None:
    records = run([*TWO_TWO, "clock.hardware=a100", "router=least_outstanding"])
    req = records.requests
    assert len(req) == 40 and set(req["prefill_replica"]) == {0, 1} and set(req["decode_replica"]) == {0, 1}
    assert (req["kv_transfer_s"] > 0).all()
    # the first token reaches the user when its KV reaches the decode replica: after the transfer
    for column in ("ttft", "e2e", "tpot"):
        assert req[column].notna().all()
    assert (req["ttft"] > req["kv_transfer_s"]).all()
    assert (req["first_token_time"] >= req["first_scheduled_time"] + req["kv_transfer_s"]).all()
    assert (req["decode_wait_s"] >= 0).all()
    assert set(records.steps["pool"]) == {"prefill", "decode"} and set(records.steps["replica"]) == {0, 1, 2, 3}
    prefill = records.steps[records.steps["pool"] == "prefill"]
    assert prefill["num_decode_tokens"].sum() == 0  # a prefill replica computes prompts only


def test_the_transfer_is_kv_bytes_over_bandwidth_plus_latency() -> None:
    one = ["workload.num_requests=8", "clock.model=llama-2-7b", "engine.max_model_len=4096"]
    slow = run([*one, "cluster.link=pcie", "cluster.link_bandwidth_gbps=1"]).requests
    fast = run([*one, "cluster.link=pcie"]).requests
    per_token = 2 * 32 * 32 * 128 * 2  # llama-2-7b: K and V, 32 layers, 32 heads of 128, fp16
    expected = 10e-6 + slow["num_prompt_tokens"] * per_token / 1e9
    assert slow["kv_transfer_s"].to_numpy() == pytest.approx(expected.to_numpy(), rel=1e-9)
    assert (slow["ttft"] > fast["ttft"]).all()
    overlapped = run([*one, "cluster.link=pcie", "cluster.link_bandwidth_gbps=1", "cluster.layerwise_overlap=true"])
    assert (overlapped.requests["kv_transfer_s"] < slow["kv_transfer_s"]).all()
    assert (overlapped.requests["kv_transfer_s"] >= 10e-6 + expected / 32 - 10e-6 / 32).all()


def test_link_presets_cite_their_numbers() -> None:
    assert link_preset("nvlink").bandwidth > link_preset("pcie").bandwidth > link_preset("infiniband").bandwidth
    for name in ("nvlink", "infiniband", "pcie"):
        text = (ROOT / "conf" / "hardware" / "links" / f"{name}.yaml").read_text()
        assert "https://" in text


LONG_PREFILLS = [
    "workload=sharegpt",
    "workload.num_requests=60",
    "workload.arrivals.rate=10",
    "cluster.decode_replicas=3",
]


@pytest.mark.parametrize(
    ("router", "load"),
    [
        ("round_robin", [*TWO_TWO, "workload.arrivals.rate=300"]),
        ("least_outstanding", [*TWO_TWO, "workload.arrivals.rate=300"]),
        ("least_kv", [*TWO_TWO, "workload.arrivals.rate=300"]),
        # long prompts: a decode run must stop where a busy prefill could hand a request over
        ("least_outstanding", LONG_PREFILLS),
    ],
)
def test_disaggregation_is_the_same_with_fast_paths_off_and_on_rerun(router: str, load: list[str]) -> None:
    overrides = [*load, f"router={router}"]
    on = run([*overrides, "engine.fast_paths=true"])
    again = run([*overrides, "engine.fast_paths=true"])
    off = run([*overrides, "engine.fast_paths=false"])
    for other in (again, off):
        assert other.requests.equals(on.requests)
        assert other.steps.equals(on.steps)


def run_py(*overrides: str, run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "run.py", *BASE, "workload.num_requests=12", *overrides, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_disaggregated_run_reports_its_pools_and_transfers(tmp_path: Path) -> None:
    proc = run_py("report=true", *TWO_TWO[:2], run_dir=tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pools" in proc.stdout and "KV transfer" in proc.stdout
    summary: dict[str, Any] = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["prefill_replicas"] == 2 and summary["decode_replicas"] == 2 and summary["link"] == "nvlink"
    assert 0 < summary["prefill_busy_fraction"] <= 1 and 0 < summary["decode_busy_fraction"] <= 1
    assert summary["mean_kv_transfer_ms"] > 0 and len(summary["per_replica"]) == 4
    req = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert {"prefill_replica", "decode_replica", "kv_transfer_s"} <= set(req.columns)
    assert (tmp_path / "run" / "replicas.png").exists()
    assert (
        "cluster=disaggregated (2 prefill + 2 decode over nvlink; router=round_robin)"
        in (tmp_path / "run" / "report.md").read_text()
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.prefill_replicas=0"], "cluster.prefill_replicas must be an integer >= 1, got 0"),
        (["cluster.decode_replicas=0"], "cluster.decode_replicas must be an integer >= 1, got 0"),
        (["cluster.link_bandwidth_gbps=0"], "cluster.link_bandwidth_gbps must be a finite number > 0, got 0"),
        (["cluster.link_bandwidth_gbps=-3.5"], "cluster.link_bandwidth_gbps must be a finite number > 0"),
        (["cluster.link=carrier_pigeon"], "cluster.link='carrier_pigeon': not an interconnect preset"),
        (["cluster.decode_overrides=[{kvcache:{num_blocks:2}}]"], "workload: request req-"),
        (["clock=wall", "model=tiny"], "cluster=disaggregated needs clock=simulated"),
        (["+sampling.n=2"], "cluster=disaggregated needs sampling.n=1"),
        (["cluster.decode_router=nearest"], "cluster.decode_router='nearest': not a router option (least_kv, "),
        (["+sampling.stop_token_ids=[65]"], "cluster=disaggregated needs no sampling.stop_token_ids"),
    ],
)
def test_a_bad_pool_or_link_is_one_line(overrides: list[str], message: str, tmp_path: Path) -> None:
    proc = run_py(*overrides, run_dir=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: ") and message in lines[0], proc.stderr


def test_a_prompt_that_fills_the_context_ends_with_its_first_token_as_on_one_engine(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,input_len,output_len\n0.0,127,20\n0.01,40,20\n")
    common = ["workload=trace", f"workload.path={trace}", "engine.max_model_len=128"]
    split = run(common).requests.set_index("request_id")
    cfg = compose_config([*(o for o in BASE if o != "cluster=disaggregated"), *common])
    alone = build_cluster(cfg).run(workload_requests(cfg, build_cluster(cfg).first), False).requests
    alone = alone.set_index("request_id")
    assert split.loc["req-000000", "num_output_tokens"] == alone.loc["req-000000", "num_output_tokens"] == 1
    assert split.loc["req-000001", "num_output_tokens"] == alone.loc["req-000001", "num_output_tokens"] == 20


@pytest.mark.parametrize(
    ("name", "target"), [("least_kv", "least_kv.LeastKV"), ("power_of_two", "power_of_two.PowerOfTwo")]
)
def test_the_decode_router_may_be_named_as_the_router_option(name: str, target: str) -> None:
    """``cluster.decode_router=least_kv`` is that option of conf/router (its ``${seed}`` resolved), as its
    config spelled out is; it was a three-line error ("Cannot instantiate config of type str")."""
    common = [*TWO_TWO, "cluster.decode_replicas=3", "workload.arrivals.rate=400"]
    by_name = run([*common, f"cluster.decode_router={name}"]).requests
    seed = ",seed:0" if name == "power_of_two" else ""
    spelled = f"{{_target_:forge.routers.{target}{seed}}}"
    assert by_name.equals(run([*common, f"cluster.decode_router={spelled}"]).requests)
    assert not by_name["decode_replica"].equals(run(common).requests["decode_replica"])  # not round robin


def test_ignore_eos_set_in_sampling_is_enough() -> None:
    """A workload run ignores EOS when the workload or ``sampling.ignore_eos`` says so; disaggregation
    refused the second as if EOS could end an output."""
    records = run(["workload.num_requests=12", "workload.ignore_eos=false", "+sampling.ignore_eos=true"])
    assert len(records.requests) == 12 and (records.requests["finish_reason"] == "length").all()
