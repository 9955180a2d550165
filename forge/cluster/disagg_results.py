"""A disaggregated run's records: one row per request joining its prefill and its decode, the steps
of both pools, and each pool's utilisation and the KV transfer times for the summary."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from forge.cluster.disagg import DisaggregatedCluster
from forge.cluster.results import load_balance, merged_frames
from forge.results.metrics import percentiles

JOINED = ("arrival_time", "first_scheduled_time", "num_prompt_tokens", "num_cached_tokens", "priority")


def disaggregated_frames(cluster: DisaggregatedCluster) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(requests, steps): a request's row has its prefill's arrival and scheduling, its first token
    when its KV reached the decode replica, its decode's tokens and finish, and ``prefill_replica``,
    ``decode_replica`` (-1: none, one output token), ``kv_transfer_s``; steps carry ``pool`` and a
    ``replica`` numbered over both pools (prefill replicas first)."""
    pre_req, pre_steps = merged_frames(cluster.prefill.replicas, "prefill_replica")
    dec_req, dec_steps = merged_frames(cluster.decode.replicas, "decode_replica")
    dec = dec_req.set_index("request_id")
    rows = pre_req.set_index("request_id")
    out = rows[list(JOINED)].copy()
    has = out.index.isin(dec.index)
    d = dec.reindex(out.index)
    out["first_token_time"] = np.where(has, d["arrival_time"], rows["first_token_time"])
    out["finish_time"] = np.where(has, d["finish_time"], rows["finish_time"])
    out["num_output_tokens"] = np.where(has, d["num_output_tokens"].fillna(0), rows["num_output_tokens"]).astype(int)
    out["num_preemptions"] = (rows["num_preemptions"] + d["num_preemptions"].fillna(0)).astype(int)
    out["finish_reason"] = d["finish_reason"].where(has, rows["finish_reason"])
    out["queue_time"] = out["first_scheduled_time"] - out["arrival_time"]
    out["ttft"] = out["first_token_time"] - out["arrival_time"]
    out["e2e"] = out["finish_time"] - out["arrival_time"]
    n = out["num_output_tokens"]
    out["tpot"] = np.where(n > 1, (out["finish_time"] - out["first_token_time"]) / (n - 1).clip(lower=1), np.nan)
    itl: list[Any] = [_itl(rid, out, d, bool(has_one)) for rid, has_one in zip(out.index, has, strict=True)]
    out["itl"] = pd.Series(itl, index=out.index, dtype=object)
    out["decode_wait_s"] = d["first_scheduled_time"] - d["arrival_time"]
    out["prefill_replica"] = rows["prefill_replica"]
    out["decode_replica"] = d["decode_replica"].fillna(-1).astype(int)
    transfers = cluster.handoffs
    out["kv_transfer_s"] = [transfers[rid].kv_transfer_s if h else 0.0 for rid, h in zip(out.index, has, strict=True)]
    steps = pd.concat(
        [
            pre_steps.rename(columns={"prefill_replica": "replica"}).assign(pool="prefill"),
            dec_steps.rename(columns={"decode_replica": "replica"}).assign(pool="decode"),
        ],
        ignore_index=True,
    )
    steps.loc[steps["pool"] == "decode", "replica"] += len(cluster.prefill.replicas)
    return out.reset_index(), steps


def _itl(rid: str, out: pd.DataFrame, dec: pd.DataFrame, decoded: bool) -> np.ndarray:
    """The gaps between a request's tokens: first (its KV's arrival) to its decode's first, then the decode's."""
    if not decoded:
        return np.empty(0)
    first_gap = float(dec["first_token_time"][rid]) - float(out["first_token_time"][rid])
    return np.concatenate([[first_gap], np.asarray(dec.at[rid, "itl"], dtype=float)])


def pool_summary(
    cluster: DisaggregatedCluster, requests: pd.DataFrame, steps: pd.DataFrame, duration: float
) -> dict[str, Any]:
    """Each pool's size, mean busy fraction and load balance, the per-replica rows of both, the link
    and the KV transfer times (``*_kv_transfer_ms``, over the requests that decoded)."""
    out: dict[str, Any] = {"link": cluster.link.name, "layerwise_overlap": cluster.layerwise}
    rows: list[dict[str, Any]] = []
    offset = 0
    for name, pool in (("prefill", cluster.prefill), ("decode", cluster.decode)):
        own = steps[steps["pool"] == name]
        mine = own.assign(**{f"{name}_replica": own["replica"] - offset})
        balance = load_balance(requests, mine, pool.replicas, duration, f"{name}_replica", f"{name}_replica")
        per = balance.pop(f"per_{name}_replica")
        out.update(balance)
        out[f"{name}_busy_fraction"] = float(np.mean([row["busy_fraction"] for row in per]))
        rows += [{**row, "pool": name, "replica": row["replica"] + offset} for row in per]
        offset += len(pool.replicas)
    out["per_replica"] = rows
    moved = requests.loc[requests["decode_replica"] >= 0, "kv_transfer_s"]
    out.update(percentiles(moved, "kv_transfer"))
    return out
