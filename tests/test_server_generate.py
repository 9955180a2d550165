"""POST /generate, forge-infer's shape: {"prompt", "max_tokens"} ->
{"text", "tokens", "prompt_tokens", "completion_tokens"} (tokens: the generated ids, issue 18's shape)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer
from tests.server_helpers import error_of


def test_generate_is_greedy_completions_in_forge_infers_shape(tmp_path: Path) -> None:
    cfg = compose_config(["model=tiny", f"server.state_dir={tmp_path}", "server.api_keys=[k]"])
    app, _ = app_from_config(cfg, "tiny")
    auth = {"Authorization": "Bearer k"}
    with BackgroundServer(app) as s:
        r = httpx.post(s.url + "/generate", json={"prompt": "hello forge", "max_tokens": 9}, headers=auth)
        assert r.status_code == 200 and set(r.json()) == {"text", "tokens", "prompt_tokens", "completion_tokens"}
        body = {"model": "tiny", "prompt": "hello forge", "max_tokens": 9, "temperature": 0}
        same = httpx.post(s.url + "/v1/completions", json=body, headers=auth).json()
        assert r.json()["text"] == same["choices"][0]["text"] and "token_ids" not in same["choices"][0]
        tokens = r.json()["tokens"]
        assert len(tokens) == r.json()["completion_tokens"] and all(isinstance(t, int) for t in tokens)
        detok = httpx.post(s.url + "/detokenize", json={"model": "tiny", "tokens": tokens}, headers=auth).json()
        assert detok["prompt"] == r.json()["text"]
        assert r.json()["prompt_tokens"] == same["usage"]["prompt_tokens"]
        assert r.json()["completion_tokens"] == same["usage"]["completion_tokens"]
        # forge-infer's example, curl -d '{...}', sends its JSON as a form body
        as_form = {**auth, "Content-Type": "application/x-www-form-urlencoded"}
        raw = json.dumps({"prompt": "hello forge", "max_tokens": 9})
        assert httpx.post(s.url + "/generate", content=raw, headers=as_form).json() == r.json()
        assert error_of(httpx.post(s.url + "/generate", content="{nope", headers=as_form), 400)
        assert error_of(httpx.post(s.url + "/generate", json=["x"], headers=auth), 400)
        default = httpx.post(s.url + "/generate", json={"prompt": "x"}, headers=auth).json()
        assert 1 <= default["completion_tokens"] <= 32  # forge-infer's default max_tokens
        assert error_of(httpx.post(s.url + "/generate", json={"prompt": "x", "stream": True}, headers=auth), 400)
        assert error_of(httpx.post(s.url + "/generate", json={"prompt": "x", "max_tokens": 0}, headers=auth), 400)
        assert error_of(httpx.post(s.url + "/generate", json={"max_tokens": 3}, headers=auth), 400)["param"] == "prompt"
        assert error_of(httpx.post(s.url + "/generate", json={"prompt": "x"}), 401)
