"""``model.tokenizer=none`` (issue 38): a random safetensors checkpoint without tokenizer files runs on
token ids (vLLM's ``skip_tokenizer_init``); whatever needs text is refused, naming the setting."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from safetensors.torch import save_file

from forge.core.sampling_params import SamplingParams
from forge.llm import LLM
from forge.models.llama import random_state_dict
from forge.models.safetensors_loader import load_safetensors
from forge.server.background import BackgroundServer
from tests.gguf_fixtures import tiny_config
from tests.server_helpers import error_of, serving

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 300
SETTING = "model.tokenizer=none"


def write_random_checkpoint(directory: Path) -> Path:
    """config.json and model.safetensors of a random tiny Llama: no tokenizer files."""
    config = tiny_config(VOCAB)
    state = {k: v.float().contiguous() for k, v in random_state_dict(config, seed=5).items()}
    save_file(state, str(directory / "model.safetensors"))
    hf = {
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "max_position_embeddings": config.max_position,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (directory / "config.json").write_text(json.dumps(hf))
    return directory


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("random_ckpt"))


def overrides(checkpoint: Path) -> list[str]:
    return ["model=safetensors", f"model.path={checkpoint}", SETTING, "engine.max_num_seqs=4"]


@pytest.fixture(scope="module")
def llm(checkpoint: Path) -> LLM:
    return LLM(*overrides(checkpoint))


def test_the_default_still_needs_tokenizer_json(checkpoint: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_safetensors(str(checkpoint))


def test_token_id_prompts_generate_without_text(llm: LLM, checkpoint: Path) -> None:
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    (out,) = llm.generate([[1, 17, 42, 99]], params)
    assert len(out.token_ids) == 5 and all(0 <= t < VOCAB for t in out.token_ids)
    assert out.text == ""
    model = load_safetensors(str(checkpoint), tokenizer="none")
    assert model.tokenizer.eos_token_ids == frozenset({2}) and model.tokenizer.vocab_size == VOCAB


@pytest.mark.parametrize(
    "call",
    [
        lambda llm: llm.generate("hello"),
        lambda llm: llm.chat([{"role": "user", "content": "hi"}]),
        lambda llm: llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, stop=["x"])),
        lambda llm: llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, regex="a+")),
    ],
    ids=["text", "chat", "stop", "structured"],
)
def test_text_is_refused_naming_the_setting(llm: LLM, call: object) -> None:
    with pytest.raises(ValueError, match=SETTING):
        call(llm)  # type: ignore[operator]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def test_forge_run_takes_lengths_and_refuses_text_prompts(checkpoint: Path, tmp_path: Path) -> None:
    base = [*overrides(checkpoint), "clock=wall", f"hydra.run.dir={tmp_path / 'run'}"]
    ok = _run(
        [
            *base,
            "workload=fixed",
            "workload.num_requests=2",
            "workload.input_len.value=8",
            "workload.output_len.value=3",
        ]
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"arrival_time": 0.0, "prompt": "hello", "output_len": 2}) + "\n")
    bad = _run([*base, "workload=trace", f"workload.path={trace}"])
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr[-2000:]
    assert SETTING in lines[0] and lines[0].startswith("config error: workload:")


def test_a_bad_tokenizer_value_is_a_config_error(checkpoint: Path, tmp_path: Path) -> None:
    bad = _run(["model=safetensors", f"model.path={checkpoint}", "model.tokenizer=nope", f"hydra.run.dir={tmp_path}"])
    assert bad.returncode == 2 and bad.stderr.strip() == "config error: model.tokenizer='nope': expected auto or none"


@pytest.fixture(scope="module")
def server(checkpoint: Path) -> Iterator[BackgroundServer]:
    with serving(overrides(checkpoint), "random") as s:
        yield s


def _client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("stream", [False, True])
def test_server_completes_token_id_prompts(server: BackgroundServer, stream: bool) -> None:
    kw: Any = {"model": "random", "prompt": [1, 17, 42], "max_tokens": 4, "temperature": 0}
    kw["extra_body"] = {"ignore_eos": True, "return_token_ids": True}
    chunks = list(_client(server).completions.create(stream=True, **kw)) if stream else []
    if not stream:
        chunks = [_client(server).completions.create(**kw)]
    ids = [t for c in chunks for t in (c.choices[0].model_extra or {}).get("token_ids") or []]
    assert len(ids) == 4 and all(0 <= t < VOCAB for t in ids)
    assert "".join(c.choices[0].text for c in chunks) == ""
    assert (chunks[0].choices[0].model_extra or {})["prompt_token_ids"] == [1, 17, 42]


COMPLETION = {"model": "random", "prompt": [1, 2, 3], "max_tokens": 2}
REFUSED = [
    ("/v1/completions", {**COMPLETION, "prompt": "hello"}, "prompt"),
    ("/v1/completions", {**COMPLETION, "stop": ["x"]}, "stop"),
    ("/v1/completions", {**COMPLETION, "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {**COMPLETION, "logprobs": 1}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "echo": True}, "echo"),
    ("/v1/chat/completions", {"model": "random", "messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ("/tokenize", {"model": "random", "prompt": "hi"}, None),
    ("/detokenize", {"model": "random", "tokens": [1, 2]}, None),
    ("/v1/embeddings", {"model": "random", "input": "hi"}, None),
]


@pytest.mark.parametrize(("path", "body", "param"), REFUSED, ids=[f"{p}:{r}" for p, _, r in REFUSED])
def test_server_refuses_text_with_a_400(server: BackgroundServer, path: str, body: dict[str, Any], param: str) -> None:
    err = error_of(httpx.post(server.url + path, json=body, timeout=60), 400)
    assert SETTING in err["message"] and err["param"] == param and err["type"] == "invalid_request_error"


def test_official_client_sees_the_refusal(server: BackgroundServer) -> None:
    with pytest.raises(openai.BadRequestError, match=SETTING):
        _client(server).chat.completions.create(model="random", messages=[{"role": "user", "content": "hi"}])
