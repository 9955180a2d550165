"""Conformance of every component option: each YAML in conf/scheduler, conf/kvcache and conf/drafter
(globbed, so an option added later is covered without touching this file) gives the same greedy
outputs as the reference (scheduler=fcfs, kvcache=paged, no drafter) on a small fixed workload with
model=tiny, and leaves the engine idle (every request finished, every KV block free).

The workload makes the options matter: fewer sequences than prompts (so the policies reorder the
queue), a token budget smaller than the prompts (chunked prefill; sarathi's chunk_size defaults to it),
shared prefixes with prefix caching on wherever the cache offers it (so lpm reorders) and prompts that
repeat themselves (so the n-gram drafter's drafts get accepted). Each option keeps its YAML defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from forge import LLM, SamplingParams

CONF = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("scheduler", "kvcache", "drafter")
REFERENCE = ["scheduler=fcfs", "kvcache=paged"]
WORKLOAD = ["model=tiny", "engine.max_num_seqs=3", "engine.max_num_batched_tokens=16", "kvcache.block_size=4"]

SHARED = [200 + (7 * i) % 50 for i in range(12)]
PROMPTS: list[list[int]] = [
    *(SHARED + [40 + i, 41 + i] * (1 + i) for i in range(3)),  # a shared 12-token prefix
    *([60 + i, 61 + i, 62 + i] * (2 + 2 * i) for i in range(3)),  # repeating: drafts get accepted
    *([90 + (5 * j + i) % 80 for j in range(3 + 6 * i)] for i in range(2)),
]
PARAMS = [SamplingParams(max_tokens=5 + 2 * i, temperature=0.0, ignore_eos=True) for i in range(len(PROMPTS))]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


CASES = [pytest.param(group, option, id=f"{group}={option}") for group in GROUPS for option in options(group)]


def caches_prefixes(kvcache: str) -> bool:
    """Whether the kvcache option offers prefix caching (then the case turns it on)."""
    return "enable_prefix_caching" in OmegaConf.load(CONF / "kvcache" / f"{kvcache}.yaml")


def greedy(overrides: list[str]) -> list[list[int]]:
    llm = LLM(*WORKLOAD, *overrides)
    outs = [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]
    assert not llm.engine.has_unfinished()
    llm.engine.check_idle()  # run() checks it too; this says so here
    return outs


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return greedy(REFERENCE)


def test_every_group_has_options_and_the_reference_exists() -> None:
    for group in GROUPS:
        assert options(group), group
    assert {"fcfs", "paged"} <= set(options("scheduler")) | set(options("kvcache"))


@pytest.mark.parametrize(("group", "option"), CASES)
def test_greedy_outputs_match_the_reference(group: str, option: str, reference: list[list[int]]) -> None:
    chosen = dict(o.split("=") for o in REFERENCE) | {group: option}
    overrides = [f"{g}={o}" for g, o in chosen.items()]
    if caches_prefixes(chosen["kvcache"]):
        overrides.append("kvcache.enable_prefix_caching=true")
    outs = greedy(overrides)
    assert [len(o) for o in outs] == [p.max_tokens for p in PARAMS]
    assert outs == reference
