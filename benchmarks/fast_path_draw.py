"""Random configs for ``benchmarks.fast_path_sweep``: overrides of ``python run.py model=synthetic
clock=simulated`` over the scheduler, KV cache, engine limits, workload, sampling, cluster, clock and
drafter options, with pools small enough to preempt. Most draws are valid; a few are refused with a
one-line config error (the sweep skips those)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TypeVar

SCHEDULERS = ("fcfs", "sjf", "priority", "lpm", "sarathi", "vllm_v0", "decode_first", "prefill_first")
ROUTERS = ("round_robin", "random", "least_outstanding", "vidur_lor", "least_kv", "power_of_two", "prefix_aware")
SJF = "{scheduler:{_target_:forge.policies.sjf.SJF}}"  # a replica's own policy (the run's may not be fcfs: refused)
T = TypeVar("T")


@dataclass
class Draw:
    """One random config: its overrides, and what the draw decided that the sweep reads."""

    overrides: list[str] = field(default_factory=list)
    max_len: int = 0  # the longest prompt + output the workload can draw
    max_prompt: int = 0  # the longest prompt
    max_model_len: int | None = None  # engine.max_model_len where the draw sets it
    disaggregated: bool = False
    timing_only: bool = False

    def add(self, *items: str) -> None:
        self.overrides.extend(items)


def pick(rng: random.Random, *options: T) -> T:
    return rng.choice(options)


def draw_workload(rng: random.Random, d: Draw) -> None:
    name = pick(rng, "poisson", "gamma", "shared_prefix", "fixed")
    d.add(f"workload={name}", f"workload.num_requests={rng.randint(100, 300)}")
    d.add(f"workload.num_priorities={rng.randint(1, 4)}")
    out_high = pick(rng, 4, 16, 64, 200)
    out_low = rng.randint(1, out_high)
    if name == "shared_prefix":
        prefix, suffix_high = pick(rng, 16, 64, 256, 512), pick(rng, 16, 64, 128)
        d.add(f"workload.num_prefixes={rng.randint(1, 8)}", f"workload.prefix_len={prefix}")
        d.add(f"workload.suffix_len.low={rng.randint(1, suffix_high)}", f"workload.suffix_len.high={suffix_high}")
        d.add(f"workload.zipf={pick(rng, 0.0, 1.0)}")
        d.add(f"workload.output_len.low={out_low}", f"workload.output_len.high={out_high}")
        d.max_prompt = prefix + suffix_high
    elif name == "fixed":
        d.max_prompt = pick(rng, 1, 7, 64, 300, 900)
        d.add(f"workload.input_len.value={d.max_prompt}", f"workload.output_len.value={out_high}")
    else:
        d.max_prompt = pick(rng, 16, 128, 512, 1500)
        d.add(f"workload.input_len.low={rng.randint(1, d.max_prompt)}", f"workload.input_len.high={d.max_prompt}")
        d.add(f"workload.output_len.low={out_low}", f"workload.output_len.high={out_high}")
    d.max_len = d.max_prompt + out_high
    if name != "fixed":
        d.add(f"workload.arrivals.rate={pick(rng, 2.0, 20.0, 100.0, 1000.0)}")
    if name == "gamma":
        d.add(f"workload.arrivals.burstiness={pick(rng, 0.1, 0.5, 2.0)}")


def draw_scheduler(rng: random.Random, d: Draw) -> str:
    name = pick(rng, *SCHEDULERS)
    d.add(f"scheduler={name}")
    if name == "sarathi":  # a chunk below max_model_len needs chunked prefill: draw_engine keeps it on
        d.add(f"scheduler.chunk_size={pick(rng, 'null', 16, 64, 256)}")
    elif name == "sjf" and rng.random() < 0.5:
        d.add("scheduler.oracle=true")
    elif name == "lpm" and rng.random() < 0.5:
        d.add(f"scheduler.max_queue={pick(rng, 1, 8, 128)}")
    elif name == "vllm_v0":
        d.add(f"scheduler.watermark={pick(rng, 0.0, 0.01, 0.1)}")
    return name


def draw_engine(rng: random.Random, d: Draw, scheduler: str) -> bool:
    """The engine's limits; returns whether preemption swaps."""
    chunked = rng.random() < (0.2 if scheduler == "vllm_v0" else 0.7)
    chunked = chunked or any(o.startswith("scheduler.chunk_size=") and o[-1].isdigit() for o in d.overrides)
    d.add(f"engine.enable_chunked_prefill={str(chunked).lower()}", f"engine.max_num_seqs={pick(rng, 1, 2, 4, 16, 64)}")
    max_model_len = None
    if rng.random() < 0.15:  # the context ends some outputs before their max_tokens
        max_model_len = d.max_prompt + rng.randint(2, 20)
    elif d.max_len > 2000 or not chunked:
        max_model_len = max(d.max_len + 16, 256)
    if max_model_len is not None:
        d.add(f"engine.max_model_len={max_model_len}")
        d.max_model_len = max_model_len
    whole = max(d.max_len, max_model_len or 2048)
    budget = pick(rng, 16, 64, 256, 512, 2048) if chunked else max(whole, pick(rng, 512, 2048, 4096))
    d.add(f"engine.max_num_batched_tokens={budget}")
    swap = rng.random() < 0.4
    if swap:
        d.add("engine.preemption_mode=swap")
    return swap


def draw_kvcache(rng: random.Random, d: Draw, swap: bool) -> None:
    paged = rng.random() < 0.75
    block = pick(rng, 1, 4, 8, 16, 32)
    d.add(f"kvcache={'paged' if paged else 'naive'}", f"kvcache.block_size={block}")
    held = d.max_len  # the most tokens one request holds (as the naive cache reserves them)
    if not paged:
        reservation = pick(rng, "max", "pow2", "oracle")
        d.add(f"kvcache.reservation={reservation}")
        if d.max_model_len is None:
            d.max_model_len = max(d.max_len + 1, pick(rng, 256, 2048))
            d.add(f"engine.max_model_len={d.max_model_len}")
        if reservation != "oracle":
            held = d.max_model_len if reservation == "max" else min(1 << (d.max_len - 1).bit_length(), d.max_model_len)
    if rng.random() < 0.7:  # small enough to preempt
        need = math.ceil(held / block) + 1
        d.add(f"kvcache.num_blocks={int(need * pick(rng, 1.0, 1.5, 3.0, 10.0)) + rng.randint(0, 3)}")
    if paged and not d.timing_only and rng.random() < 0.5:
        d.add("kvcache.enable_prefix_caching=true")
    if paged and swap and rng.random() < 0.3:
        d.add(f"kvcache.num_cpu_blocks={pick(rng, 0, 4, 64)}")


def draw_sampling(rng: random.Random, d: Draw) -> None:
    if rng.random() < 0.2:
        d.add("sampling=random", f"sampling.seed={pick(rng, 'null', 1, 7)}")
        d.add(f"sampling.temperature={pick(rng, 0.5, 1.0, 2.0)}")
    if not d.disaggregated and rng.random() < 0.15:
        d.add(f"+sampling.n={pick(rng, 2, 3)}")
    if rng.random() < 0.15:
        d.add(f"+sampling.presence_penalty={pick(rng, 0.5, -1.0)}")
    if rng.random() < 0.1:
        d.add(f"+sampling.repetition_penalty={pick(rng, 0.5, 1.5)}", f"sampling.top_k={pick(rng, 0, 1, 5)}")
    if rng.random() < 0.1:
        d.add(f"+sampling.logprobs={pick(rng, 0, 2)}")
    ids_matter = not d.timing_only and not d.disaggregated
    if ids_matter and rng.random() < 0.1:
        d.add(f"+sampling.stop_token_ids=[{rng.randint(32, 127)}]")
    if ids_matter and rng.random() < 0.1:
        d.add("workload.ignore_eos=false")


def draw_cluster(rng: random.Random, d: Draw) -> None:
    router = pick(rng, *ROUTERS)
    if rng.random() < 0.2:
        d.disaggregated = True
        d.add("cluster=disaggregated", f"router={router}", f"cluster.link={pick(rng, 'nvlink', 'infiniband', 'pcie')}")
        d.add(f"cluster.prefill_replicas={rng.randint(1, 2)}", f"cluster.decode_replicas={rng.randint(1, 3)}")
        if rng.random() < 0.5:
            d.add("cluster.layerwise_overlap=true")
        if rng.random() < 0.3:
            d.add(f"cluster.decode_router={pick(rng, 'least_outstanding', 'least_kv')}")
        return
    replicas = pick(rng, 1, 1, 2, 3, 4)
    d.add(f"cluster.replicas={replicas}", f"router={router}")
    if replicas > 1 and rng.random() < 0.3:
        d.add(f"cluster.hardware=[{','.join(pick(rng, 'a100', 'h100') for _ in range(replicas))}]")
    if replicas > 1 and rng.random() < 0.2:
        per = ",".join(
            pick(rng, "{}", "{engine:{max_num_seqs:2}}", "{kvcache:{block_size:8}}", SJF) for _ in range(replicas)
        )
        d.add(f"cluster.overrides=[{per}]")


def draw_clock(rng: random.Random, d: Draw) -> None:
    d.add(f"clock.hardware={pick(rng, 'a100', 'h100', 'h200', 'a100-40gb')}")
    d.add(f"clock.model={pick(rng, 'auto', 'auto', 'llama-2-7b', 'llama-2-13b', 'tinyllama-1.1b')}")
    if rng.random() < 0.2:
        d.add("clock.cost=roofline")
    elif rng.random() < 0.2:
        d.add(f"clock.tensor_parallel={pick(rng, 2, 4)}")
    if rng.random() < 0.2:
        d.add(f"engine.kv_cache_dtype={pick(rng, 'int8', 'fp8', 'fp8_e5m2')}")


def draw(rng: random.Random) -> Draw:
    """A random config."""
    d = Draw()
    d.add(f"seed={rng.randint(0, 10_000)}")
    draw_workload(rng, d)
    swap = draw_engine(rng, d, draw_scheduler(rng, d))
    d.timing_only = rng.random() < 0.25
    draw_kvcache(rng, d, swap)
    if d.timing_only:
        d.add("model.timing_only=true")
    elif rng.random() < 0.2:
        d.add("drafter=ngram", f"drafter.num_speculative_tokens={pick(rng, 1, 3, 5)}")
        d.add(f"drafter.adaptive={pick(rng, 'true', 'false')}")
    draw_cluster(rng, d)
    draw_sampling(rng, d)
    draw_clock(rng, d)
    return d
