from __future__ import annotations

import os
import subprocess
import sys

from forge import LLM, SamplingParams


def test_generate_strings_and_token_lists() -> None:
    llm = LLM("model=tiny", "kvcache=naive")
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts: list[str | list[int]] = ["Hello, forge", [256, 72, 105]]
    outs = llm.generate(prompts, params)
    assert len(outs) == 2
    for out in outs:
        assert len(out.token_ids) == 8
        assert isinstance(out.text, str)
        assert out.finish_reason == "length"
    again = llm.generate("Hello, forge", params)
    assert again[0].token_ids == outs[0].token_ids


def test_seeded_sampling_is_reproducible_and_batch_independent() -> None:
    llm = LLM("model=tiny")
    p = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=123, ignore_eos=True)
    alone = llm.generate("abc", p)[0].token_ids
    crowd = llm.generate(["zzz", "abc", "qq"], [SamplingParams(max_tokens=5, temperature=1.0), p, p])
    assert crowd[1].token_ids == alone
    other_seed = llm.generate("abc", SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True))
    assert other_seed[0].token_ids != alone


def test_stop_token_ids_end_generation() -> None:
    llm = LLM("model=synthetic")
    free = llm.generate("hello", SamplingParams(max_tokens=20, temperature=0.0))[0]
    stop_at = free.token_ids[5]
    first = free.token_ids.index(stop_at)
    stopped = llm.generate("hello", SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[stop_at]))[0]
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"


def test_unseeded_sampling_is_the_same_in_every_process() -> None:
    """Request seeds come from a stable hash of the request id, not Python's per-process ``hash``."""
    code = (
        "from forge import LLM; print([o.token_ids for o in LLM('sampling=random').generate(['Hello there', 'abc'])])"
    )
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outs.append(done.stdout.strip().splitlines()[-1])
    assert outs[0] == outs[1]
