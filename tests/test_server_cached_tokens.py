"""``usage.prompt_tokens_details.cached_tokens``, through the OpenAI client: the prompt tokens whose KV
came from the prefix cache, on whole and streamed answers, 0 with prefix caching off (OpenAI's field,
on every response)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

PROMPT = "The quick brown fox jumps over the lazy dog. " * 4  # 180 bytes: 11 full blocks of 16 tokens


def start(caching: bool) -> BackgroundServer:
    cfg = compose_config(["model=tiny", f"kvcache.enable_prefix_caching={str(caching).lower()}"])
    app, _ = app_from_config(cfg, "tiny")
    return BackgroundServer(app).start()


@pytest.fixture(scope="module", params=[True, False], ids=["caching", "no-caching"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[openai.OpenAI, bool]]:
    server = start(request.param)
    try:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0), request.param
    finally:
        server.stop()


def cached(usage: object) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    assert details is not None, usage
    return int(details.cached_tokens)


def test_a_repeated_prompt_reports_its_cached_tokens(served: tuple[openai.OpenAI, bool]) -> None:
    client, caching = served
    first = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3)
    again = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3)
    assert first.usage is not None and again.usage is not None
    assert cached(first.usage) == 0
    n = again.usage.prompt_tokens
    # the full blocks of the prompt, less the last token (its logits must be computed)
    assert cached(again.usage) == (((n - 1) // 16) * 16 if caching else 0), again.usage


def test_chat_and_streamed_usage_carry_it(served: tuple[openai.OpenAI, bool]) -> None:
    client, caching = served
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT + "chat"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=2, stream=True, stream_options={"include_usage": True}
    )
    last = [chunk for chunk in stream][-1]
    assert whole.usage is not None and last.usage is not None
    assert cached(whole.usage) == 0
    assert (cached(last.usage) > 0) is caching and cached(last.usage) < last.usage.prompt_tokens, last.usage


def preempted_usages(overrides: list[str], prompts: list[str], max_tokens: int) -> list[int]:
    """Each prompt's ``cached_tokens``, all sent at once (greedy to ``max_tokens``) to a tiny server with
    prefix caching and ``overrides``; asserts that some request was preempted (else nothing is tested)."""
    cfg = compose_config(["model=tiny", "kvcache.enable_prefix_caching=true", *overrides])
    app, _ = app_from_config(cfg, "tiny")
    server = BackgroundServer(app).start()
    try:

        def usage(prompt: str) -> int:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
            answer = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            return int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        with ThreadPoolExecutor(len(prompts)) as pool:
            counts = list(pool.map(usage, prompts))
        text = httpx.get(server.url + "/metrics").text
    finally:
        server.stop()
    preemptions = re.search(r'forge:num_preemptions_total\{model_name="tiny"\} ([0-9.]+)', text)
    assert preemptions and float(preemptions.group(1)) > 0, "no request was preempted: the test tests nothing"
    return counts


def test_a_request_preempted_and_recomputed_reports_what_its_first_admission_found() -> None:
    """Distinct prompts on a KV cache too small for all of them: requests are preempted (by recompute)
    and, readmitted, find their own prompt (and output) blocks in the prefix cache. Their usage still
    reports the cache hits of their first admission, none (vLLM's): never more than the prompt."""
    prompts = [f"{i:03d} distinct prompt {i} " * 3 for i in range(6)]
    assert preempted_usages(["kvcache.num_blocks=16"], prompts, 120) == [0] * 6


def test_a_beam_search_reports_the_prompts_cached_tokens(served: tuple[openai.OpenAI, bool]) -> None:
    """A beam search's beams are engine requests of their own; its usage reports the cache hits of its
    first beam's prompt, as a sampled request's does."""
    client, caching = served
    prompt = PROMPT + "beams"
    client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    beams = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=3, n=2, extra_body={"use_beam_search": True}
    )
    assert beams.usage is not None and len(beams.choices) == 2
    n = beams.usage.prompt_tokens
    assert cached(beams.usage) == (((n - 1) // 16) * 16 if caching else 0), beams.usage


def test_a_request_preempted_during_its_chunked_prefill_reports_its_first_admissions_hits() -> None:
    """Three distinct 201-token prompts, a 48-token step budget and a 16-block cache: a request whose
    prompt is part computed is preempted (by recompute) before its first output, and readmitted finds its
    own computed chunks in the prefix cache. Its usage reports what its first admission found: none."""
    prompts = [(f"{i:03d} a long distinct prompt number {i}; " * 8)[:200] for i in range(3)]
    assert preempted_usages(["kvcache.num_blocks=16", "engine.max_num_batched_tokens=48"], prompts, 8) == [0] * 3
