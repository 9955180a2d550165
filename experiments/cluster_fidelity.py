"""forge against Vidur on identical requests, one or several replicas (issues 32 and 35).

``python -m experiments.cluster_fidelity REF.csv [REF.csv ...] [--out DIR]`` replays each reference
that ``experiments/vidur_reference.py`` exported from a Vidur run (the requests, the replica Vidur's
global scheduler chose, Vidur's per-request TTFT / TPOT / E2E) through forge with the configuration
``reports/fidelity`` compares (A100, Llama-2-7B, ``vllm_v0``, 128 sequences, 4,096 tokens, 7,424 KV
blocks, no chunked prefill) and tables forge ÷ Vidur of the mean and p90 of each metric.

A reference of N > 1 replicas runs forge with ``cluster.replicas=N`` and the router named in
``ROUTERS`` (Vidur's ``round_robin`` -> forge's ``round_robin``, ``lor`` -> ``vidur_lor``): forge's
cluster feature (issue 32). A layout forge refuses (a pool of 0, an unknown link) is a one-line config error.

Each row names the attention profile Vidur ran with (``attention``: ``measured``, ``transcribed`` (the
one-GPU rows of the measured profile, ``benchmarks/vidur_transcribed_profile.py``) or ``computed`` and the
first 12 hex digits of its sha256, from the reference's JSON; ``unrecorded`` for a reference exported
before the label existed). With ``computed`` (``benchmarks/vidur_attention_profile.py``) Vidur charges
forge's own attention costs: the ratios then check forge's cluster layer, scheduling and dense layer
against Vidur's, not forge's attention against Vidur's measurements."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from experiments.fidelity import LIMITS

REF_COLUMNS = ("request_id", "arrival_time", "input_len", "output_len", "replica", "ttft_s", "tpot_s", "e2e_s")
ROUTERS = {"round_robin": "round_robin", "lor": "vidur_lor", "random": "random"}
METRICS = ("ttft", "tpot", "e2e")
BASE = [
    *LIMITS,
    "clock.hardware=a100",
    "clock.cost=operators",
    "workload=trace",
    "workload.unsorted=sort",
]  # Vidur writes rows by id


def read_reference(path: Path) -> dict[str, np.ndarray]:
    """The reference's columns (``REF_COLUMNS``), checked; a missing column is a one-line error."""
    import pandas as pd

    df = pd.read_csv(path)
    missing = [c for c in REF_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{path}: not a Vidur reference (missing columns {missing}; see experiments/vidur_reference.py)"
        )
    return {c: df[c].to_numpy() for c in REF_COLUMNS}


def vidur_setup(path: Path) -> tuple[int, str]:
    """Replicas and global scheduler of the Vidur run (the flags in the JSON beside the CSV)."""
    meta = path.with_suffix(".json")
    if not meta.is_file():
        return 1, "round_robin"
    flags = dict(f.removeprefix("--").split("=", 1) for f in json.loads(meta.read_text())["vidur_flags"] if "=" in f)
    return int(flags.get("cluster_config_num_replicas", 1)), flags.get("global_scheduler_config_type", "round_robin")


def attention_label(path: Path) -> str:
    """The attention profile of the Vidur run (``attention_profile`` in the JSON beside the CSV)."""
    meta = path.with_suffix(".json")
    profile = json.loads(meta.read_text()).get("attention_profile") if meta.is_file() else None
    if not profile:
        return "unrecorded"
    return f"{profile['label']} {profile['sha256'][:12]}"


def forge_overrides(path: Path, replicas: int, router: str) -> list[str]:
    if router not in ROUTERS:
        raise ValueError(f"{path}: Vidur's global scheduler {router!r} has no forge router (known: {sorted(ROUTERS)})")
    cluster = [f"cluster.replicas={replicas}", f"router={ROUTERS[router]}"] if replicas > 1 else []
    return [*BASE, f"workload.path={path}", *cluster, "progress=false", "report=false"]


def simulate(overrides: list[str]) -> dict[str, np.ndarray]:
    """forge's per-request columns for one run (``request_id``, ``ttft``, ``tpot``, ``e2e``, ``replica`` if any)."""
    from hydra.errors import HydraException

    from forge.cluster.run import build_cluster
    from forge.config import ConfigError, compose_config
    from forge.engine.build import workload_requests

    try:
        cfg = compose_config(overrides)
    except (ConfigError, HydraException) as err:
        if any(o.startswith("cluster.") for o in overrides):
            first = str(err).splitlines()[0]
            raise SystemExit(f"config error: the reference's cluster layout: {first}") from err
        raise
    cluster = build_cluster(cfg)  # one replica: the engine alone (forge.main.run_offline's path)
    try:
        frame = cluster.run(workload_requests(cfg, cluster.first), False).requests
    finally:
        cluster.close()
    keys = ("request_id", "ttft", "tpot", "e2e", "replica", "kv_transfer_s")
    return {k: frame[k].to_numpy() for k in keys if k in frame}


def ratios(forge: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> dict[str, float]:
    """forge ÷ Vidur of each metric's mean and p90, requests matched by id; and the share of requests
    that ran on the replica Vidur chose (where forge reports one)."""
    order = {rid: i for i, rid in enumerate(forge["request_id"])}
    idx = np.array([order[rid] for rid in ref["request_id"]])
    out: dict[str, float] = {}
    for m in METRICS:
        mine, theirs = forge[m][idx].astype(float), ref[f"{m}_s"].astype(float)
        keep = ~(np.isnan(mine) | np.isnan(theirs))
        out[f"mean_{m}"] = float(mine[keep].mean() / theirs[keep].mean())
        out[f"p90_{m}"] = float(np.percentile(mine[keep], 90) / np.percentile(theirs[keep], 90))
    out["same_replica"] = float(np.mean(forge["replica"][idx] == ref["replica"])) if "replica" in forge else math.nan
    return out


def disaggregated_overrides(path: Path, prefill: int, decode: int, link: str) -> list[str]:
    """forge's ``cluster=disaggregated`` on the reference's requests: ``prefill`` + ``decode`` replicas."""
    split = [f"cluster.prefill_replicas={prefill}", f"cluster.decode_replicas={decode}", f"cluster.link={link}"]
    return [*BASE, f"workload.path={path}", "cluster=disaggregated", *split, "progress=false", "report=false"]


def disaggregated(path: Path, prefill: int, decode: int, link: str) -> dict[str, Any]:
    """The reference's requests on ``prefill`` + ``decode`` disaggregated replicas: forge's mean and p90
    of each metric and of the KV transfer (ms), beside Vidur's on its aggregated replicas (Vidur has no
    disaggregated mode, so no ratio)."""
    ref, forge = read_reference(path), simulate(disaggregated_overrides(path, prefill, decode, link))
    row: dict[str, Any] = {"reference": path.name, "layout": f"{prefill} prefill + {decode} decode", "link": link}
    for m in METRICS:
        mine, theirs = forge[m].astype(float), ref[f"{m}_s"].astype(float)
        row[f"mean_{m}"], row[f"p90_{m}"] = 1e3 * np.nanmean(mine), 1e3 * np.nanpercentile(mine, 90)
        row[f"vidur_mean_{m}"] = 1e3 * np.nanmean(theirs)
    row["mean_kv_transfer"] = 1e3 * float(np.nanmean(forge["kv_transfer_s"]))
    return row


def compare(path: Path) -> dict[str, Any]:
    ref = read_reference(path)
    replicas, router = vidur_setup(path)
    res = ratios(simulate(forge_overrides(path, replicas, router)), ref)
    row = {"reference": path.name, "replicas": replicas, "router": router, "requests": len(ref["request_id"]), **res}
    return row | {"attention": attention_label(path)}


def report(rows: list[dict[str, Any]]) -> list[str]:
    import pandas as pd

    from experiments.common import header, provenance, table

    df = pd.DataFrame(rows)
    cols = [f"{s}_{m}" for m in METRICS for s in ("mean", "p90")]
    off = (df[cols] - 1).abs()
    prov = provenance() | {"command": "python -m experiments.cluster_fidelity " + " ".join(sys.argv[1:])}
    computed = [
        "Vidur ran with an attention profile computed from forge's own cost model (attention `computed`): "
        "attention costs are forge's on both sides, so these ratios check the rest (routing, per-replica "
        "scheduling and batching, the dense layer against Vidur's measured mlp.csv), not forge's attention.",
        "",
    ]
    return [
        *header("forge ÷ Vidur on Vidur's requests", __doc__.split("\n\n")[1], prov, table="fidelity.csv"),
        *(computed if df["attention"].str.startswith("computed").any() else []),
        f"{int((off <= 0.10).sum().sum())} of {off.size} metrics within 10% of Vidur's; the furthest is "
        f"{float(off.max().max()):.0%} off.",
        "",
        table(
            df,
            ["reference", "replicas", "router", "requests", *cols, "same_replica", "attention"],
            dict.fromkeys(cols, ".2f"),
        ),
        "",
    ]


def disaggregated_report(rows: list[dict[str, Any]]) -> list[str]:
    """The disaggregated runs' section of ``fidelity.md`` (none: nothing)."""
    if not rows:
        return []
    import pandas as pd

    from experiments.common import table

    cols = [f"{s}_{m}" for m in METRICS for s in ("mean", "p90", "vidur_mean")]
    return [
        "## `cluster=disaggregated` on the same requests (ms)",
        "",
        "Vidur has no disaggregated mode: forge's figures, with Vidur's means on its aggregated replicas beside "
        "them (`vidur_mean_*`), not ratios. TTFT includes the KV transfer.",
        "",
        table(
            pd.DataFrame(rows),
            ["reference", "layout", "link", *cols, "mean_kv_transfer"],
            dict.fromkeys([*cols, "mean_kv_transfer"], ".1f"),
        ),
        "",
    ]


def split_spec(text: str) -> tuple[int, int]:
    """``P+D`` -> (P, D)."""
    prefill, _, decode = text.partition("+")
    return int(prefill), int(decode)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.cluster_fidelity", description=__doc__.split("\n\n")[0])
    ap.add_argument("references", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("reports/cluster"))
    ap.add_argument(
        "--disaggregated",
        type=split_spec,
        metavar="P+D",
        help="also run cluster=disaggregated, P prefill + D decode replicas, on each reference of P + D replicas",
    )
    ap.add_argument("--link", default="nvlink", help="cluster.link of the disaggregated runs")
    args = ap.parse_args(argv)
    rows = [compare(p) for p in args.references]
    split: tuple[int, int] | None = args.disaggregated
    disagg = [
        disaggregated(p, split[0], split[1], args.link)
        for p, r in zip(args.references, rows, strict=True)
        if split and r["replicas"] == sum(split)
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    import pandas as pd

    pd.DataFrame(rows).to_csv(args.out / "fidelity.csv", index=False)
    (args.out / "fidelity.md").write_text("\n".join([*report(rows), *disaggregated_report(disagg)]))
    print(f"report: {args.out / 'fidelity.md'}")


if __name__ == "__main__":
    main()
