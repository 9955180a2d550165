"""``model.tokenizer=none`` (issue 38): a random safetensors checkpoint without tokenizer files runs on
token ids (vLLM's ``skip_tokenizer_init``); whatever needs text is refused, naming the setting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_file

from forge.core.sampling_params import SamplingParams
from forge.llm import LLM
from forge.models.llama import random_state_dict
from forge.models.safetensors_loader import load_safetensors
from tests.gguf_fixtures import tiny_config

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
