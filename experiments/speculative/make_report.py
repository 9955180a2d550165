"""Plots and reports/speculative/README.md from the study CSVs (python experiments/speculative/make_report.py)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

OUT = Path(__file__).resolve().parents[2] / "reports" / "speculative"


def load(name: str) -> tuple[pd.DataFrame | None, dict[str, str]]:
    path = OUT / name
    if not path.exists():
        return None, {}
    meta = {}
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            k, v = line[2:].split(": ", 1)
            meta[k] = v
    try:
        return pd.read_csv(path, comment="#"), meta
    except pd.errors.EmptyDataError:  # a run that has not finished its first case
        return None, meta


def plot_speedup(df: pd.DataFrame, path: Path, title: str) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    spec = df[df.drafter != "none"]
    for (workload, drafter), g in spec.groupby(["workload", "drafter"]):
        axes[0].plot(g.batch, g.speedup, marker="o", label=f"{workload} / {drafter}")
        axes[1].plot(g.batch, g.tokens_per_target_forward, marker="o", label=f"{workload} / {drafter}")
    axes[0].axhline(1.0, color="grey", lw=0.8, ls="--")
    axes[0].set(xscale="log", xlabel="batch (concurrent requests)", ylabel="speedup vs no speculation", title=title)
    axes[1].set(xscale="log", xlabel="batch (concurrent requests)", ylabel="tokens per target forward")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(df: pd.DataFrame) -> str:
    cols = [
        "workload",
        "drafter",
        "batch",
        "output_tokens",
        "seconds",
        "speedup",
        "tokens_per_target_forward",
        "mean_acceptance_length",
        "acceptance_rate",
        "acceptance_per_position",
        "identical_to_no_spec",
    ]
    cols[3:3] = [c for c in ("requests",) if c in df]
    cols[cols.index("output_tokens") + 1 : cols.index("output_tokens") + 1] = [c for c in ("preemptions",) if c in df]
    cols[cols.index("speedup") + 1 : cols.index("speedup") + 1] = [
        c for c in ("decode_speedup", "prefill_step_seconds", "decode_step_seconds") if c in df
    ]
    cols += [c for c in ("copied_fraction", "loadavg") if c in df]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df[cols].iterrows():
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in r]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def findings(df: pd.DataFrame, goals: bool) -> list[str]:
    """Goals at batch 1 on the grounded workload and where speculation stops paying, from the table."""
    out = []
    spec = df[df.drafter != "none"]
    for (workload, drafter), g in spec.groupby(["workload", "drafter"], sort=False):
        g = g.sort_values("batch")
        b1 = g[g.batch == g.batch.min()].iloc[0]
        losing = g[g.speedup < 1.0]
        stop = f"slower than no speculation from batch {int(losing.batch.min())}" if len(losing) else "never slower"
        best = g.loc[g.speedup.idxmax()]
        line = (
            f"- {workload} / {drafter}: batch {int(b1.batch)}: {b1.tokens_per_target_forward:.2f} tokens per target "
            f"forward, {b1.speedup:.2f}x speedup"
            + (f" ({b1.decode_speedup:.2f}x on the decode steps)" if "decode_speedup" in g else "")
            + f"; best {best.speedup:.2f}x at batch {int(best.batch)}; {stop} "
            f"(batches run: {', '.join(str(int(b)) for b in g.batch)})."
        )
        if goals and workload == "grounded" and int(b1.batch) == 1:
            ok_t = "met" if b1.tokens_per_target_forward >= 2.0 else "NOT met"
            ok_s = "met" if b1.speedup >= 1.5 else "NOT met"
            line += f" Goals at batch 1: >= 2.0 tokens per forward {ok_t}, >= 1.5x speedup {ok_s}."
        out.append(line)
    return out


def section(names: str | list[str], title: str, plot: str, blurb: str, goals: bool = True) -> list[str]:
    """One README section from one or more CSVs (each with its own command, commit and uptime lines)."""
    names = [names] if isinstance(names, str) else names
    loaded = [(name, *load(name)) for name in names]
    missing = [name for name, df, _ in loaded if df is None]
    if len(missing) == len(names):
        return [f"## {title}", "", f"Not run yet (`{'`, `'.join(missing)}` missing).", ""]
    df = pd.concat([d for _, d, _ in loaded if d is not None], ignore_index=True)
    plot_speedup(df, OUT / plot, title)
    provenance: list[str] = []
    for name, d, meta in loaded:
        if d is None:
            provenance += [f"`{name}`: not run yet.", ""]
            continue
        provenance += [
            f"`{name}` ({', '.join(sorted(d.workload.unique()))}):  ",
            f"Command: `{meta.get('command', '?')}`  ",
            f"Commit: `{meta.get('commit', '?')}`; CPU: {meta.get('cpu', '?')} (shared with other jobs).  ",
            *[f"`uptime` {k[len('uptime ') :]}: `{v}`  " for k, v in meta.items() if k.startswith("uptime")],
            "",
        ]
    return [
        f"## {title}",
        "",
        blurb,
        "",
        *findings(df, goals),
        "",
        *provenance,
        table(df),
        "",
        f"![{title}]({plot})",
        "",
    ]


def main() -> None:
    lines = [
        "# Speculative decoding study",
        "",
        "Generated by `python experiments/speculative/make_report.py` from the CSVs in this directory.",
        "All runs are greedy (`temperature=0`, `ignore_eos=true`), all requests arrive at t = 0 and",
        "`engine.max_num_seqs` = batch; speedup = time without a drafter / time with it, on identical",
        "requests; `identical_to_no_spec` checks every output token against the non-speculative run.",
        "Tokens per target forward = output tokens / (request, step) verifications (including the",
        "first token after prefill). Mean acceptance length = tokens emitted per verified draft (accepted",
        "draft tokens + the target's own token), over the steps that had a draft; acceptance rate = accepted /",
        "proposed draft tokens. Drafter: `ngram`, `num_speculative_tokens=5`, n in [1, 4], adaptive.",
        "",
    ]
    lines += section(
        "synthetic_simulated.csv",
        "Simulated clock: synthetic model charged as Llama-3-8B on an H100 (roofline)",
        "sim_speedup.png",
        "The synthetic stand-in does not read its prompt (next token = hash of the last `order` tokens), so "
        "its acceptance comes from its own repetitiveness, not from the stdlib text in the prompt: "
        "`grounded` uses `order=1, repetitiveness=0.98` as a proxy for copying, `chat` uses "
        "`order=1, repetitiveness=0.8`. The roofline charges each step max(compute, memory): at small batch "
        "a step costs the weight read whatever the number of tokens, so drafts are almost free; as the "
        "batch grows, the step becomes compute-bound and rejected drafts cost real FLOPs.",
        goals=False,  # the goals are about the real model's input-grounded workload
    )
    grounded = (
        "`grounded` prompts are completion-style (no chat template): the source of a small stdlib function "
        "(`textwrap.wrap`, `string.capwords`, `functools.total_ordering`, `textwrap.fill`, `shlex.split`, "
        "`functools.wraps`, `textwrap.shorten`, `functools._c3_merge`, `textwrap.indent`, in turn), shown "
        "twice, then a third copy cut two words into its docstring, so the model continues it verbatim. "
        "`copied_fraction` = share of the output (up to the length of the rest of the passage) that reproduces "
        "it character for character from the start; the rest is the model drifting from the passage (then it "
        "keeps generating, since `ignore_eos`). `chat` prompts are open questions through the chat template. "
        "Batch 1 runs 8 requests one after another (`--min-requests 8`). "
    )
    lines += section(
        "real_smollm2_wall.csv",
        "Wall clock on CPU: SmolLM2-135M-Instruct (model=smollm2)",
        "real_speedup.png",
        grounded + "Wall time on a 2-core machine shared with other engineers' jobs (`loadavg` = 1-minute "
        "load average before->after each case, `uptime` above; the runs used `backend.num_threads=2` after the "
        "other benchmarks had stopped, so a load near 2 is this run itself) and `engine.kv_cache_memory_gib=2` "
        "so that batch 32 runs without preemption (the default 0.5 GiB holds about 11k SmolLM2 tokens); "
        "`decode_speedup` compares only the steps that computed no prompt tokens (prefill is the same work "
        "with and without a drafter, and the grounded prompts are long). One run per case, treat as "
        "indicative (the chat rows at batch 1 changed sign between an earlier, contended run and this one). "
        "On the CPU a forward's cost grows with the tokens it computes almost from batch 1, so rejected "
        "draft tokens are never free: the chat workload, whose drafts are mostly rejected, does not gain here, "
        "while the grounded workload's drafts are accepted so often that fewer, larger forwards still win at "
        "batch 32 on the decode steps; the end-to-end gain shrinks with batch because the long grounded "
        "prompts' prefill (unchanged by speculation) is a growing share of the time. "
        "Samples of the grounded outputs: [real_smollm2_grounded_samples.md](real_smollm2_grounded_samples.md).",
    )
    lines += section(
        "real_smollm2_simulated.csv",
        "Simulated clock: SmolLM2-135M-Instruct's own dims on an H100 (roofline)",
        "real_sim_speedup.png",
        grounded + "The real model computes every token on the CPU (so acceptance is the real model's), but "
        "time is the roofline's prediction for a 135M model on an H100 (`clock=simulated`, `model: auto`): "
        "with so few weights to read, every step up to batch 32 costs about the same, so even the chat "
        "workload's few accepted drafts pay; the crossover to a slowdown needs far larger batches (see the "
        "8B-dims synthetic section above, where chat turns into a slowdown at batch 256). Batches above 32 are "
        "not run with the real model: it computes every token on this 2-core CPU.",
    )
    (OUT / "README.md").write_text("\n".join(lines))
    print(OUT / "README.md")


if __name__ == "__main__":
    main()
