"""The OpenAI client, unchanged, against ``forge.server`` on a loopback port."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from openai.types.completion_create_params import CompletionCreateParamsBase, CompletionCreateParamsStreaming
from openai.types.shared_params import ResponseFormatJSONSchema

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
    "required": ["city", "n"],
}


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    cfg = compose_config(["model=tiny", "engine.max_num_seqs=16"])
    app, _ = app_from_config(cfg, "tiny")
    with BackgroundServer(app) as s:
        yield s
    state = app.state.forge
    assert state.engine.leak is None and state.engine.error is None


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def wait_idle(server: BackgroundServer, timeout: float = 10.0) -> None:
    engine = server.app.state.forge.engine.engine
    deadline = time.monotonic() + timeout
    while engine.has_unfinished() or engine.scheduler.kv.num_free_blocks() != engine.scheduler.kv.num_blocks:
        assert time.monotonic() < deadline, "engine did not go idle"
        time.sleep(0.02)


def test_models_health_tokenize(server: BackgroundServer, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert httpx.get(server.url + "/health").status_code == 200
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "héllo"}).json()["tokens"]
    assert ids[0] == 256 and len(ids) == 7
    assert httpx.post(server.url + "/detokenize", json={"tokens": ids}).json()["prompt"] == "héllo"


def test_completion_chat_and_usage(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="Hello", max_tokens=6, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage is not None and r.usage.prompt_tokens == 6 and r.usage.completion_tokens <= 6
    c = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
    )
    assert c.choices[0].message.role == "assistant" and c.usage is not None
    assert c.usage.prompt_tokens == len("user: hi\nassistant:") + 1  # the byte tokenizer's plain transcript + BOS


def test_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    kw: CompletionCreateParamsBase = {"model": "tiny", "prompt": "abc", "max_tokens": 12, "temperature": 0.0}
    full = client.completions.create(**kw).choices[0].text
    streaming: CompletionCreateParamsStreaming = {**kw, "stream": True, "stream_options": {"include_usage": True}}
    chunks = list(client.completions.create(**streaming))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x"}]
    chat = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    stream = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, stream=True)
    parts = list(stream)
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == chat.choices[0].message.content
    assert parts[-1].choices[0].finish_reason == chat.choices[0].finish_reason


def test_n_choices_and_seed_reproducibility(client: openai.OpenAI) -> None:
    kw: CompletionCreateParamsBase = {
        "model": "tiny",
        "prompt": ["p1", "p2"],
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 7,
        "n": 3,
    }
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert sorted(c.index for c in a.choices) == list(range(6))
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices[:3]}) > 1  # n samples of one prompt use different derived seeds
    other_seed: CompletionCreateParamsBase = {**kw, "seed": 8}
    c = client.completions.create(**other_seed)
    assert [x.text for x in c.choices] != [x.text for x in a.choices]


def test_stop_strings_are_never_emitted(client: openai.OpenAI) -> None:
    kw: CompletionCreateParamsBase = {"model": "tiny", "prompt": "The", "max_tokens": 24, "temperature": 0.0}
    full = client.completions.create(**kw).choices[0].text
    printable = [m.start() for m in re.finditer(r"[ -~]{2}", full)]
    assert printable, f"no printable pair in {full!r}"
    stop = full[printable[-1] : printable[-1] + 2]
    expected = full[: full.index(stop)]
    stops: CompletionCreateParamsBase = {**kw, "stop": [stop, "\x00never"]}
    r = client.completions.create(**stops)
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    streaming: CompletionCreateParamsStreaming = {**kw, "stop": stop, "stream": True}
    streamed = "".join(c.choices[0].text for c in client.completions.create(**streaming))
    assert streamed == expected
    tok = full.encode("utf-8")[len(expected.encode("utf-8"))]
    r = client.completions.create(extra_body={"stop_token_ids": [tok]}, **kw)
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"


def test_echo_and_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="Hi", max_tokens=4, temperature=0, echo=True, logprobs=3)
    ch = r.choices[0]
    assert ch.text.startswith("Hi")
    n_prompt = r.usage.prompt_tokens if r.usage else 0
    assert ch.logprobs is not None and len(ch.logprobs.token_logprobs or []) == n_prompt + 4  # the prompt's, then 4
    lps, tops = ch.logprobs.token_logprobs or [], ch.logprobs.top_logprobs or []
    assert lps[0] is None and tops[0] is None  # the first prompt token has none
    for lp, top in zip(lps[1:], tops[1:], strict=True):
        assert lp is not None and lp <= 0 and 1 <= len(top) <= 4  # keys are token texts: byte tokens may collide
    c = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "q"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = c.choices[0].logprobs.content if c.choices[0].logprobs else None
    assert content is not None and len(content) == 3
    for t in content:  # greedy: the chosen token is the most likely one
        assert len(t.top_logprobs) == 2 and abs(t.logprob - t.top_logprobs[0].logprob) < 1e-9


def test_structured_output_validates_even_when_cut(client: openai.OpenAI) -> None:
    fmt: ResponseFormatJSONSchema = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
    for max_tokens in (22, 40):
        r = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "city?"}],
            max_tokens=max_tokens,
            temperature=1.0,
            seed=max_tokens,
            response_format=fmt,
        )
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMA)
    r2 = client.completions.create(model="tiny", prompt="x", max_tokens=30, extra_body={"json_schema": SCHEMA})
    jsonschema.validate(json.loads(r2.choices[0].text), SCHEMA)
    r3 = client.completions.create(model="tiny", prompt="x", max_tokens=9, extra_body={"regex": r"id-[0-9]{3,}"})
    assert re.fullmatch(r"id-[0-9]{3,}", r3.choices[0].text)
    r4 = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "j"}],
        max_tokens=12,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(r4.choices[0].message.content or ""), dict)


def test_async_client_concurrent_streams(server: BackgroundServer) -> None:
    async def main() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

        async def one(i: int) -> str:
            stream = await aclient.completions.create(
                model="tiny", prompt=f"q{i}", max_tokens=6, temperature=0, stream=True
            )
            return "".join([c.choices[0].text async for c in stream])

        try:
            return await asyncio.gather(*(one(i) for i in range(8)))
        finally:
            await aclient.close()

    texts = asyncio.run(main())
    assert len(texts) == 8
    wait_idle(server)


def test_disconnect_aborts_and_frees_blocks(server: BackgroundServer) -> None:
    body = {"model": "tiny", "prompt": "long", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        it = r.iter_lines()
        got = [line for line, _ in zip(it, range(6), strict=False) if line.startswith("data:")]
        assert got
    wait_idle(server)
    metrics = httpx.get(server.url + "/metrics").text
    assert re.search(r'forge:request_success_total\{finished_reason="abort",model_name="tiny"\} [1-9]', metrics)


def test_metrics_have_vllm_names(server: BackgroundServer) -> None:
    done = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert done.status_code == 200, done.text  # (a request first: histograms show buckets once observed)
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prompt_tokens_total",
        "generation_tokens_total",
        "num_preemptions_total",
        "request_success_total",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        "spec_decode_num_drafts_total",
        "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total",
        "time_to_first_token_seconds_bucket",
        "inter_token_latency_seconds_bucket",
        "e2e_request_latency_seconds_bucket",
        "request_queue_time_seconds_bucket",
    ):
        assert f"forge:{name}" in text, name
    m = re.search(r'forge:generation_tokens_total\{model_name="tiny"\} ([0-9.]+)', text)
    assert m and float(m.group(1)) > 0
    info = re.search(r'forge:cache_config_info\{block_size="(\d+)",model_name="tiny",num_gpu_blocks="(\d+)"\} 1', text)
    assert info and int(info.group(1)) > 0 and int(info.group(2)) > 0, text  # the KV cache's size, as vLLM's
