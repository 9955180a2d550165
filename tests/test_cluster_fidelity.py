"""experiments/cluster_fidelity.py: forge replays a Vidur reference (its requests, replicas and
per-request metrics) and tables forge ÷ Vidur; the Vidur half (experiments/vidur_reference.py) runs
only where benchmarks/vidur_setup.sh laid Vidur out, and its test skips elsewhere."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments import cluster_fidelity as cf

REPO = Path(__file__).resolve().parent.parent
VIDUR_VENV = Path(os.environ.get("VIDUR_VENV", "/work/vidur-venv"))
VIDUR_SRC = Path(os.environ.get("VIDUR_SRC", "/work/vidur-src"))


def write_reference(path: Path, n: int = 12, scale: float = 1.0, replicas: int = 1) -> None:
    """A reference whose 'Vidur' metrics are forge's own on the same requests, times ``scale``."""
    rows = [
        {"request_id": f"req-{i:06d}", "arrival_time": 0.05 * i, "input_len": 256 + 32 * i, "output_len": 8 + i}
        for i in range(n)
    ]
    fields = ["request_id", "arrival_time", "input_len", "output_len"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    forge = cf.simulate(cf.forge_overrides(path, 1, "round_robin"))
    order = {rid: i for i, rid in enumerate(forge["request_id"])}
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(cf.REF_COLUMNS))
        w.writeheader()
        for r in rows:
            i = order[r["request_id"]]
            m = {f"{k}_s": repr(float(forge[k][i]) * scale) for k in cf.METRICS}
            w.writerow({**r, "replica": 0, **m})
    flags = [f"--cluster_config_num_replicas={replicas}", "--global_scheduler_config_type=round_robin"]
    path.with_suffix(".json").write_text(json.dumps({"vidur_flags": flags}))


def test_forge_against_its_own_metrics_is_one_and_against_half_is_two(tmp_path: Path) -> None:
    same, half = tmp_path / "same.csv", tmp_path / "half.csv"
    write_reference(same)
    write_reference(half, scale=0.5)
    rows = [cf.compare(same), cf.compare(half)]
    for key in ("mean_ttft", "p90_ttft", "mean_tpot", "p90_tpot", "mean_e2e", "p90_e2e"):
        assert rows[0][key] == pytest.approx(1.0, rel=1e-12)
        assert rows[1][key] == pytest.approx(2.0, rel=1e-12)
    cf.main([str(same), str(half), "--out", str(tmp_path / "out")])
    md = (tmp_path / "out" / "fidelity.md").read_text()
    assert "6 of 12 metrics within 10% of Vidur's; the furthest is 100% off." in md
    assert "| same.csv | 1 | round_robin | 12 | 1.00 |" in md


def test_each_row_names_the_attention_profile_vidur_ran_with(tmp_path: Path) -> None:
    measured, computed = tmp_path / "measured.csv", tmp_path / "computed.csv"
    write_reference(measured, n=4)
    write_reference(computed, n=4)
    meta = json.loads(computed.with_suffix(".json").read_text())
    meta["attention_profile"] = {"label": "computed", "sha256": "c8d8e33c3661" + "0" * 52, "origin": "forge"}
    computed.with_suffix(".json").write_text(json.dumps(meta))
    assert cf.compare(measured)["attention"] == "unrecorded"
    assert cf.compare(computed)["attention"] == "computed c8d8e33c3661"
    cf.main([str(measured), "--out", str(tmp_path / "a")])
    assert "computed from forge's own cost model" not in (tmp_path / "a" / "fidelity.md").read_text()
    cf.main([str(measured), str(computed), "--out", str(tmp_path / "b")])
    md = (tmp_path / "b" / "fidelity.md").read_text()
    assert "attention costs are forge's on both sides" in md
    assert "| 1.00 | 1.00 | 1 | computed c8d8e33c3661 |" in md


def test_a_two_replica_reference_runs_on_forges_cluster_behind_round_robin(tmp_path: Path) -> None:
    path = tmp_path / "rr2.csv"
    write_reference(path, n=10, replicas=2)
    df = pd.read_csv(path)
    df["replica"] = [int(r.removeprefix("req-")) % 2 for r in df.request_id]  # Vidur's round robin, by arrival
    df.to_csv(path, index=False)
    row = cf.compare(path)
    assert (row["replicas"], row["router"], row["same_replica"]) == (2, "round_robin", 1.0)
    assert row["mean_ttft"] < 1.0  # the single engine's metrics, now spread over two replicas


def test_disaggregated_runs_the_references_requests_on_the_same_number_of_replicas(tmp_path: Path) -> None:
    two, one = tmp_path / "rr2.csv", tmp_path / "rr1.csv"
    write_reference(two, n=10, replicas=2)
    write_reference(one, n=4)
    row = cf.disaggregated(two, 1, 1, "pcie")
    assert (row["layout"], row["link"]) == ("1 prefill + 1 decode", "pcie")
    assert row["mean_kv_transfer"] > 0  # every request has several output tokens: its KV crosses the link
    aggregated = pd.read_csv(two)
    assert row["vidur_mean_ttft"] == pytest.approx(1e3 * aggregated.ttft_s.mean())
    slower = cf.disaggregated(two, 1, 1, "nvlink")["mean_kv_transfer"]
    assert slower < row["mean_kv_transfer"]  # NVLink moves the same KV faster than PCIe
    cf.main([str(two), str(one), "--disaggregated", "1+1", "--link", "pcie", "--out", str(tmp_path / "out")])
    md = (tmp_path / "out" / "fidelity.md").read_text()
    assert "## `cluster=disaggregated` on the same requests (ms)" in md
    assert "| rr2.csv | 1 prefill + 1 decode | pcie |" in md and "| rr1.csv | 1 prefill" not in md
    with pytest.raises(SystemExit, match="config error: the reference's cluster layout: cluster.prefill_replicas"):
        cf.disaggregated(two, 0, 2, "nvlink")
    cf.main([str(two), "--out", str(tmp_path / "plain")])
    assert "## `cluster=disaggregated`" not in (tmp_path / "plain" / "fidelity.md").read_text()


def test_requests_are_matched_by_id_not_by_row_order(tmp_path: Path) -> None:
    path = tmp_path / "ref.csv"
    write_reference(path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n")  # same requests, rows reversed
    assert cf.compare(path)["p90_ttft"] == pytest.approx(1.0, rel=1e-12)
    forge = {"request_id": np.array(["a", "b"]), "replica": np.array([0, 1]), "ttft": np.array([1.0, 3.0])}
    forge |= {"tpot": np.array([5.0, 3.0]), "e2e": forge["ttft"]}
    ref = {"request_id": np.array(["b", "a"]), "replica": np.array([1, 0]), "ttft_s": np.array([3.0, 2.0])}
    ref |= {"tpot_s": np.array([3.0, np.nan]), "e2e_s": np.array([3.0, 2.0])}  # a: one output token, no TPOT
    got = cf.ratios(forge, ref)
    assert got["same_replica"] == 1.0  # b on replica 1 and a on 0 in both
    assert got["mean_tpot"] == 1.0  # b's 3.0 against b's 3.0; a left out on both sides
    assert got["mean_ttft"] == pytest.approx(4.0 / 5.0)


def test_a_reference_missing_a_column_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "ref.csv"
    path.write_text("request_id,arrival_time,input_len,output_len,replica,ttft_s,e2e_s\nreq-0,0,16,4,0,0.1,0.2\n")
    with pytest.raises(ValueError, match=r"ref.csv: not a Vidur reference \(missing columns \['tpot_s'\]"):
        cf.read_reference(path)


def test_several_replicas_run_forge_with_its_cluster_and_the_matching_router(tmp_path: Path) -> None:
    path = tmp_path / "ref.csv"
    path.write_text("x\n")
    path.with_suffix(".json").write_text(
        json.dumps({"vidur_flags": ["--cluster_config_num_replicas=4", "--global_scheduler_config_type=lor"]})
    )
    replicas, router = cf.vidur_setup(path)
    assert (replicas, router) == (4, "lor")
    overrides = cf.forge_overrides(path, replicas, router)
    assert overrides[-4:-2] == ["cluster.replicas=4", "router=vidur_lor"]
    assert not any(o.startswith("cluster.") for o in cf.forge_overrides(path, 1, "round_robin"))
    with pytest.raises(ValueError, match="global scheduler 'least_loaded' has no forge router"):
        cf.forge_overrides(path, 2, "least_loaded")


@pytest.mark.skipif(
    not (VIDUR_VENV / "bin" / "python").is_file()
    or not (VIDUR_SRC / "ATTENTION_PROFILE").is_file(),  # written by the setup script once attention.csv checks out
    reason="Vidur is not laid out here (benchmarks/vidur_setup.sh)",
)
def test_vidur_reference_exports_vidur_requests_and_metrics(tmp_path: Path) -> None:
    out = tmp_path / "rr2.csv"
    cmd = [str(VIDUR_VENV / "bin/python"), str(REPO / "experiments/vidur_reference.py"), "--replicas=2"]
    cmd += ["--qps=4", "--num-requests=20", f"--out={out}"]
    subprocess.run(cmd, cwd=VIDUR_SRC, check=True, timeout=1800, stdout=sys.stderr)
    ref = cf.read_reference(out)
    assert list(ref["replica"]) == [i % 2 for i in range(20)]
    assert (np.diff(ref["arrival_time"]) > 0).all() and (ref["input_len"] == 512).all()
    assert (ref["e2e_s"] > ref["ttft_s"]).all()
    assert cf.vidur_setup(out) == (2, "round_robin")
    installed = dict(line.split("=", 1) for line in (VIDUR_SRC / "ATTENTION_PROFILE").read_text().splitlines())
    assert cf.attention_label(out) == f"{installed['label']} {installed['sha256'][:12]}"
