"""The report of ``experiments.route_real``: measured vs simulated TTFT / TPOT per router, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.common import section, table, write_readme, write_results

STATS = ("mean", "p50", "p90")


def long_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (router, metric): measured, simulated and their ratio."""
    out = []
    for router, g in rows.groupby("router", sort=False):
        sides = g.set_index("side")
        for metric in ("ttft", "tpot"):
            for stat in STATS:
                col = f"{stat}_{metric}_ms"
                real, sim = (float(sides[col].to_dict()[side]) for side in ("measured", "simulated"))
                out.append(
                    {
                        "router": router,
                        "metric": f"{stat} {metric.upper()} (ms)",
                        "measured": real,
                        "simulated": sim,
                        "measured/simulated": real / sim if sim > 0 else float("nan"),
                    }
                )
    return pd.DataFrame(out)


def split_table(rows: pd.DataFrame) -> pd.DataFrame:
    sides = {s: g.set_index("router") for s, g in rows.groupby("side")}
    real, sim = sides["measured"], sides["simulated"]
    return pd.DataFrame(
        {
            "router": real.index,
            "completed": real["completed"].to_numpy(),
            "failed": real["failed"].to_numpy(),
            "measured requests per backend": real["requests_per_replica"].to_numpy(),
            "simulated requests per replica": sim.loc[real.index, "requests_per_replica"].to_numpy(),
        }
    )


def interpretation(ratios: pd.DataFrame, rows: pd.DataFrame, fit: dict[str, Any]) -> list[str]:
    def r(metric: str) -> pd.Series:
        return ratios[ratios["metric"].str.contains(metric)]["measured/simulated"]

    real = rows[rows["side"] == "measured"].set_index("router")
    sim = rows[rows["side"] == "simulated"].set_index("router")
    order_real, order_sim = list(real["p90_ttft_ms"].sort_values().index), list(sim["p90_ttft_ms"].sort_values().index)
    out = [
        f"Measured ÷ simulated over the routers (mean, p50, p90): TTFT {r('TTFT').min():.2f}-{r('TTFT').max():.2f}, "
        f"TPOT {r('TPOT').min():.2f}-{r('TPOT').max():.2f}; the measured TTFT is below the simulated one in "
        f"{int((r('TTFT') < 1).sum())} of {len(r('TTFT'))} cells, the measured TPOT above it in "
        f"{int((r('TPOT') > 1).sum())} of {len(r('TPOT'))}.",
        "What the simulator leaves out, and the measurement holds: the HTTP path of every request and token (the "
        "client, the gateway, the backend's server loop, tokenising, detokenising and streaming each token as its "
        "own SSE chunk); the profiled clock is fitted to engine steps alone (`forge.calibrate` times "
        "`step_started` to `step_finished`), and for a model this small one step takes a fraction of a "
        "millisecond. The calibration's own held-out error in this run (per step "
        f"{fit['step_mape']:.0%}, whole run {fit['holdout_total_error']:+.0%}) is part of any gap.",
        f"P90 TTFT, lowest first: {', '.join(order_real)} measured; {', '.join(order_sim)} simulated"
        + (" (the same order)." if order_real == order_sim else " (a different order)."),
    ]
    split = {
        side: {str(k): str(v) for k, v in g["requests_per_replica"].items()}
        for side, g in (("real", real), ("sim", sim))
    }
    if "prefix_aware" in split["real"] and split["real"]["prefix_aware"] != split["sim"]["prefix_aware"]:
        out.append(
            f"prefix_aware split the requests {split['real']['prefix_aware']} measured and "
            f"{split['sim']['prefix_aware']} simulated: a prompt whose prefix no backend holds goes "
            "to the lowest KV usage (ties: the first backend), which the simulator reads from each replica at the "
            "arrival itself and the gateway estimates from each backend's last `/metrics` poll (every 2 s) and the "
            "prompt tokens it sent there since (`forge.gateway.load`)."
        )
    return [
        *out,
        "Wall-clock noise: the backends, the gateway, the client and this script share the machine's 2 cores with "
        "other work (the load average in the introduction), so the backends' steps run slower and later than in the "
        "calibration and the measured side varies from run to run; each router ran once (no repeats, no confidence "
        "intervals). Read the ratios as this machine's order of magnitude, not as a fidelity bound.",
        "The routers see different state on the two sides: the gateway's prefix_aware matches the token blocks it "
        "sent to each backend, the simulator's the replica's own prefix cache; least_outstanding and power_of_two "
        "count the gateway's requests in flight (measured) or the engines' unfinished ones (simulated).",
    ]


def write_report(rows: pd.DataFrame, out: Path, ctx: dict[str, Any]) -> None:
    ratios = long_table(rows)
    write_results(out, ratios)
    rows.to_csv(out / "runs.csv", index=False)
    fit = json.loads((out / "cpu-tiny.json").read_text())["fit"]
    load = f"load average (1 min) {ctx['load_start'][0]:.2f} at the start, {ctx['load_end'][0]:.2f} at the end"
    intro = (
        f"{ctx['requests']} requests (Poisson, {ctx['rate']:g} req/s; 4 system prompts of 384 tokens drawn 1/(i+1), "
        "16-128 token suffixes, 16-64 output tokens, `ignore_eos`) through "
        f"{ctx['replicas']} real `forge serve model=tiny backend.num_threads=1 kvcache.enable_prefix_caching=true` "
        "backends behind `forge route --spawn "
        f"{ctx['replicas']} router=<name>` (fresh backends per router: cold prefix caches; two 3-token requests "
        "sent straight to each backend first, as a warm-up), measured at the client "
        "by `benchmarks.serve`; and the same trace through the simulator (`cluster.replicas="
        f"{ctx['replicas']} router=<name> clock=profiled`) with the profile `forge.calibrate` measured on this "
        f"machine in this run (`cpu-tiny.csv`, `cpu-tiny.json`). {load}; the run took {ctx['wall_s']:.0f} s."
    )
    body = [
        *section("Interpretation", [f"- {s}" for s in interpretation(ratios, rows, fit)]),
        *section("Measured vs simulated", [table(ratios, list(ratios.columns), {"measured/simulated": ".2f"})]),
        *section("Requests per backend", [table(split_table(rows), list(split_table(rows).columns))]),
    ]
    write_readme(out, "Routing, real vs simulated", intro, body)
