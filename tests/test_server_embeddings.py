"""``/v1/embeddings`` (issue 18) through the official ``openai`` client, and its 400s in OpenAI's shape."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from forge.core.pooling import PoolingParams
from forge.llm import LLM
from forge.server.background import BackgroundServer
from tests.server_helpers import error_of, serving

MAX_LEN = 64


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with serving(["model=tiny", f"engine.max_model_len={MAX_LEN}"], "tiny") as s:
        yield s


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_both_encodings_equal_the_library(client: openai.OpenAI) -> None:
    inputs = ["Hello", "a longer sentence to embed"]
    floats = client.embeddings.create(model="tiny", input=inputs, encoding_format="float")
    # without encoding_format the client asks for base64 and decodes it as little-endian float32
    decoded = client.embeddings.create(model="tiny", input=inputs, user="someone")
    raw = client.embeddings.create(model="tiny", input=inputs, encoding_format="base64")  # left encoded
    assert [d.index for d in floats.data] == [0, 1] and floats.model == "tiny"
    assert [d.embedding for d in decoded.data] == [d.embedding for d in floats.data]
    as_f32 = [np.frombuffer(base64.b64decode(str(d.embedding)), dtype="<f4").tolist() for d in raw.data]
    assert as_f32 == [d.embedding for d in floats.data]
    library = LLM("model=tiny", f"engine.max_model_len={MAX_LEN}").embed(inputs, PoolingParams())
    for got, want in zip(floats.data, library, strict=True):
        assert len(got.embedding) == 64
        assert got.embedding == pytest.approx(want, abs=1e-6)  # float32 on the wire
    n = sum(len(s.encode()) + 1 for s in inputs)  # the byte tokenizer: BOS + one token per byte
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == n
    ids = client.embeddings.create(model="tiny", input=[[1, 2, 3], [4, 5]])
    one = client.embeddings.create(model="tiny", input=[1, 2, 3])
    assert one.data[0].embedding == ids.data[0].embedding and ids.usage.prompt_tokens == 5


def test_embeddings_run_beside_generation_and_count_in_metrics(server: BackgroundServer) -> None:
    async def both() -> tuple[Any, Any]:
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        completion = aclient.completions.create(model="tiny", prompt="Hi", max_tokens=24, temperature=0)
        embedding = aclient.embeddings.create(model="tiny", input=["x" * 40] * 4)
        return await asyncio.gather(completion, embedding)

    before = httpx.get(server.url + "/metrics").text
    completion, embedding = asyncio.run(both())
    assert completion.choices[0].finish_reason == "length" and len(embedding.data) == 4
    after = httpx.get(server.url + "/metrics").text

    def stops(text: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith('forge:request_success_total{finished_reason="stop"'))
        return float(line.rsplit(" ", 1)[1])

    assert stops(after) - stops(before) == 4  # each embedding input is a request that finished ("stop")


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": [[]]}, 400, "input"),
        ({"input": ["ok", ""]}, 400, "input"),
        ({"input": "x" * MAX_LEN}, 400, "input"),  # BOS + 64 bytes: one token too many
        ({"input": [320]}, 400, "input"),  # outside the 320-token vocabulary
        ({"input": [-1]}, 400, None),
        ({"input": {"text": "a"}}, 400, None),
        ({"input": [1, "a"]}, 400, None),
        ({"input": [True]}, 400, None),
        ({"input": "a", "encoding_format": "int8"}, 400, None),
        ({"input": "a", "dimensions": 32}, 400, "dimensions"),
        ({"input": "a", "truncate_prompt_tokens": 8}, 400, "truncate_prompt_tokens"),
        ({"input": "a", "model": "other"}, 404, "model"),
    ],
)
def test_bad_inputs_get_openai_shaped_errors(
    server: BackgroundServer, body: dict[str, Any], status: int, param: str | None
) -> None:
    err = error_of(httpx.post(server.url + "/v1/embeddings", json={"model": "tiny", **body}), status)
    if param is not None:
        assert err["param"] == param


def test_own_dimensions_and_the_longest_input_are_accepted(server: BackgroundServer) -> None:
    r = httpx.post(
        server.url + "/v1/embeddings", json={"model": "tiny", "input": "x" * (MAX_LEN - 1), "dimensions": 64}
    )
    assert r.status_code == 200 and r.json()["usage"] == {"prompt_tokens": MAX_LEN, "total_tokens": MAX_LEN}


def test_text_that_is_not_valid_unicode_is_a_400(server: BackgroundServer) -> None:
    body = b'{"model": "tiny", "input": ["a", "\\ud800"]}'  # a lone surrogate, escaped as JSON allows
    r = httpx.post(server.url + "/v1/embeddings", content=body, headers={"content-type": "application/json"})
    assert error_of(r, 400)["param"] == "input.1"
