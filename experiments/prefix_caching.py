"""Prefix caching: hit rate and TTFT vs block size on the shared-prefix workload, caching on vs off;
synthetic model charged as Llama-3-8B on a simulated H100."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.common import interpretation_and_results, run_grid, write_readme, write_results
from experiments.plots import lines
from experiments.seeds import CI_NOTE, SEEDS, aggregate, ci, ci_table, with_seeds

BLOCK_SIZES = (8, 16, 32, 64, 128)


PREFIX_LEN, MEAN_SUFFIX, NUM_PREFIXES = 1000, 72, 4  # suffix uniform 16-128


def simulate(size: str) -> tuple[pd.DataFrame, dict[str, object]]:
    n, sizes = {"tiny": (20, (16, 64)), "small": (300, BLOCK_SIZES)}[size]
    base = [
        "model=synthetic",
        "model.dims=llama-3-8b",
        "clock=simulated",
        "clock.cost=roofline",  # the cost model these reports were made with
        "clock.hardware=h100",
        "workload=shared_prefix",
        f"workload.num_requests={n}",
        f"workload.num_prefixes={NUM_PREFIXES}",
        f"workload.prefix_len={PREFIX_LEN}",
        "workload.arrivals.rate=20",
        "kvcache=paged",
        "engine.max_num_seqs=128",
        "engine.max_num_batched_tokens=2048",
    ]
    points = [
        [f"kvcache.block_size={b}", f"kvcache.enable_prefix_caching={c}"] for c in ("true", "false") for b in sizes
    ]
    df = run_grid("prefix_caching", base, with_seeds(points))
    df = df.rename(columns={"kvcache.block_size": "block_size", "kvcache.enable_prefix_caching": "prefix_caching"})
    df["hit_rate"] = df["prefix_cache_hits"] / df["prefix_cache_queries"].where(df["prefix_cache_queries"] > 0)
    df["hit_rate"] = df["hit_rate"].fillna(0.0)
    # what full-block caching can reuse at most: the whole blocks of the shared prefix over the mean prompt
    df["hit_rate_bound"] = (PREFIX_LEN // df["block_size"]) * df["block_size"] / (PREFIX_LEN + MEAN_SUFFIX)
    df.loc[~df["prefix_caching"].astype(bool), "hit_rate_bound"] = 0.0
    df = df.sort_values(["prefix_caching", "block_size", "seed"], ascending=[False, True, True]).reset_index(drop=True)
    return df, {"n": n}


def run(out: Path, size: str) -> None:
    df, params = simulate(size)
    write_report(df, params, out)


def interpretation(df: pd.DataFrame, params: dict[str, object]) -> list[str]:
    on = df[df["prefix_caching"].astype(bool)].set_index("block_size")
    off = df[~df["prefix_caching"].astype(bool)].set_index("block_size")
    out = []
    if len(on):
        n = int(params["n"])  # type: ignore[call-overload]
        cold = NUM_PREFIXES * PREFIX_LEN / (n * (PREFIX_LEN + MEAN_SUFFIX))
        out.append(
            f"With caching on the token hit rate is {on['hit_rate'].max():.1%} at block size "
            f"{on['hit_rate'].idxmax()} and falls to {on['hit_rate'].min():.1%} at {on['hit_rate'].idxmin()}, "
            f"{(on['hit_rate_bound'] - on['hit_rate']).max() * 100:.1f} points or less below the full-block bound "
            f"(floor(1000 / B) x B over a mean {PREFIX_LEN + MEAN_SUFFIX}-token prompt); the first request of each of "
            f"the {NUM_PREFIXES} prefixes must compute it (~{cold:.1%} of all prompt tokens), which is about that gap."
        )
    common = sorted(set(on.index) & set(off.index))
    if common:
        b0 = common[0]
        r50 = (off.loc[common, "p50_ttft_ms"] / on.loc[common, "p50_ttft_ms"]).astype(float)
        r90 = (off.loc[common, "p90_ttft_ms"] / on.loc[common, "p90_ttft_ms"]).astype(float)
        out.append(
            f"Caching cuts P50 TTFT by {r50.min():.1f}-{r50.max():.1f}x and P90 TTFT by {r90.min():.1f}-"
            f"{r90.max():.1f}x across block sizes (ratios of means; at block size {b0} P50 TTFT is "
            f"{ci(on.loc[b0], 'p50_ttft_ms')} ms on vs {ci(off.loc[b0], 'p50_ttft_ms')} ms off): a hit skips the "
            "prefill of ~1000 of ~1072 prompt tokens, so only the suffix is computed."
        )
        spread_off = off.loc[common, "p50_ttft_ms"].max() / off.loc[common, "p50_ttft_ms"].min()
        spread_on = on.loc[common, "p50_ttft_ms"].max() / on.loc[common, "p50_ttft_ms"].min()
        out.append(
            f"Block size barely moves TTFT either way (max/min P50 over block sizes: {spread_on:.2f}x with caching, "
            f"{spread_off:.2f}x without): the simulated clock charges compute by tokens, not blocks, the up to "
            f"{max(PREFIX_LEN % int(b) for b in common)} uncached prefix tokens of large blocks cost little next to "
            "a step's weight reads, and the H100's KV pool is far from full "
            f"({df['num_preemptions'].max():g} preemptions per run at most)."
        )
        out.append(
            f"Decodes benefit too: mean TPOT is {on['mean_tpot_ms'].mean():.1f} ms with caching vs "
            f"{off['mean_tpot_ms'].mean():.1f} ms without, because far fewer prefill tokens share each step with them."
        )
    out.append(
        "Published systems (vLLM's automatic prefix caching, SGLang's RadixAttention) report the same mechanism; "
        "we have no directly comparable published figure for this synthetic workload, and block-size costs a real "
        "GPU would add (such as the attention-kernel efficiency of small blocks) "
        "are not modelled by the roofline clock."
    )
    return out


COLS = ["hit_rate", "hit_rate_bound", "p50_ttft_ms", "p90_ttft_ms", "mean_tpot_ms", "request_throughput"]
KEYS = ["prefix_caching", "block_size"]


def write_report(df: pd.DataFrame, params: dict[str, object], out: Path) -> None:
    agg = aggregate(df, KEYS, [*COLS, "num_preemptions"])
    write_results(out, agg)
    df[[*KEYS, "seed", *COLS, "num_preemptions"]].to_csv(out / "results_per_seed.csv", index=False)
    plot_df = df.assign(caching=df["prefix_caching"].map({True: "caching on", False: "caching off"}))
    lines(
        plot_df,
        "block_size",
        "block size (tokens, log2)",
        ["caching"],
        [
            ("hit_rate", "prefix-cache hit rate (fraction of prompt tokens)"),
            ("p50_ttft_ms", "P50 TTFT (ms, log)"),
            ("p90_ttft_ms", "P90 TTFT (ms, log)"),
        ],
        f"Prefix caching vs block size, shared-prefix workload, Llama-3-8B on simulated H100, mean ± 95% CI over "
        f"seeds {SEEDS}",
        out / "vs_block_size.png",
        logx=True,
        logy=("p50_ttft_ms", "p90_ttft_ms"),
    )
    write_readme(
        out,
        "Prefix caching: hit rate and TTFT vs block size",
        f"Shared-prefix workload: {params['n']} requests (Poisson 20 req/s) over 4 system prompts of "
        f"{PREFIX_LEN} tokens + uniform 16-128 token suffixes, outputs 16-128 tokens; paged KV cache with prefix "
        "caching on/off; synthetic model charged as Llama-3-8B on a simulated H100 (roofline clock, "
        "deterministic), max_num_seqs 128, 2048 tokens per step. Hit rate = cached prompt tokens / prompt "
        "tokens looked up (`prefix_cache_hits / prefix_cache_queries`). Only full blocks are cached, so a "
        f"{PREFIX_LEN}-token prefix reuses floor({PREFIX_LEN} / block_size) blocks (`hit_rate_bound`). "
        + CI_NOTE.format(seeds=", ".join(map(str, SEEDS))),
        [
            "![block size](vs_block_size.png)",
            "",
            *interpretation_and_results(interpretation(agg, params), ci_table(agg, KEYS, [*COLS, "num_preemptions"])),
        ],
    )
