"""A ``json_object`` request on a busy server (four CPU hogs on this machine's cores) succeeds on its
first try: the grammar is compiled at startup, off the request path, and a request that arrives
while that compile runs awaits it (issue 37 item 2; SmolLM2's 49,152-token vocabulary)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]  # ~40-130 s: a model load under four CPU hogs


@pytest.fixture
def hogs() -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_json_object_succeeds_first_try_on_a_busy_server(hogs: None) -> None:
    app, _ = app_from_config(compose_config(["model=smollm2", "engine.max_num_seqs=4"]), "smollm2")
    with BackgroundServer(app) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        reply = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Give me a JSON object with a name."}],
            response_format={"type": "json_object"},
            max_tokens=24,
            temperature=0,
        )
        assert reply.choices[0].message.content is not None
        assert reply.choices[0].message.content.lstrip().startswith("{")
