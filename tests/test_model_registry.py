"""A model family is one module plus its registry entry.

The block between the rulers is the whole of a new family (a Llama variant with a GeGLU MLP, as
transformers' ``LlamaForCausalLM`` with ``hidden_act="gelu_pytorch_tanh"`` computes it): once its
entry is in a registry, the GGUF and SafeTensors loaders build it and the engine runs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_safetensors_loader import write_hf_dir

from forge.config import compose_config
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.kernels.base import KernelBackend, PackedLinear
from forge.kernels.cpu import native
from forge.models import llama
from forge.models.decoder import DecoderModel
from forge.models.family import CheckpointError, GGUFFormat, HFFormat, ModelFamily
from forge.models.fast_weights import apply_weight_format
from forge.models.gguf_file import GGUFError
from forge.models.gguf_loader import load_gguf
from forge.models.llama import Llama
from forge.models.registry import MODEL_REGISTRY
from forge.models.safetensors_loader import load_safetensors, read_state_dict
from tests.forward_helpers import greedy, prefill_logits
from tests.gguf_fixtures import write_tiny_gguf

# ---------------------------------------------------------------------------------------------------


class GeGLULlama(Llama):
    """Llama whose MLP gates with gelu (tanh approximation) instead of SiLU."""

    def gated_activation(self, gate_up: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        return backend.gelu_tanh_mul(gate_up)


GEGLU_LLAMA = ModelFamily(
    name="geglu_llama",
    build=GeGLULlama.from_state_dict,
    gguf=GGUFFormat(("geglu_llama",), llama.config_from_gguf, llama.GGUF_LAYER_NAMES),
    hf=HFFormat(("geglu_llama",), llama.config_from_hf),
)

# ---------------------------------------------------------------------------------------------------

REGISTRY = MODEL_REGISTRY.with_family(GEGLU_LLAMA)
PROMPT = "the theory of the quick world"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    path = tmp_path_factory.mktemp("gguf") / "geglu.gguf"
    _, state = write_tiny_gguf(path, arch="geglu_llama")
    return path, state


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hf")
    write_hf_dir(directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "geglu_llama"}))
    return directory


def transformers_logits(model: DecoderModel[Any, Any], state: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """The reference: transformers' Llama with a gelu-tanh MLP on the same weights."""
    transformers = pytest.importorskip("transformers")
    c = model.config
    config = transformers.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position,
        hidden_act="gelu_pytorch_tanh",
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        tie_word_embeddings=False,
    )
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.load_state_dict(state, strict=True)
    with torch.no_grad():
        logits: torch.Tensor = reference(torch.tensor([ids])).logits[0]
    return logits


def test_an_unregistered_architecture_is_refused(gguf_file: tuple[Path, dict[str, torch.Tensor]], hf_dir: Path) -> None:
    with pytest.raises(GGUFError, match="architecture 'geglu_llama' is not supported"):
        load_gguf(str(gguf_file[0]))
    with pytest.raises(CheckpointError, match="model_type 'geglu_llama' is not supported"):
        load_safetensors(str(hf_dir))


def test_registered_family_loads_from_gguf_and_matches_transformers(
    gguf_file: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    path, state = gguf_file
    model = load_gguf(str(path), registry=REGISTRY)
    assert type(model) is GeGLULlama
    ids = model.tokenizer.encode(PROMPT)
    ours = prefill_logits(model, ids)
    torch.testing.assert_close(ours, transformers_logits(model, state, ids), rtol=0, atol=1e-4)
    as_llama = Llama.from_state_dict(model.config, state, model.tokenizer)
    assert not torch.allclose(ours, prefill_logits(as_llama, ids), atol=1e-3)  # the family's MLP is used


def test_registered_family_loads_from_safetensors(hf_dir: Path) -> None:
    model = load_safetensors(str(hf_dir), registry=REGISTRY)
    assert type(model) is GeGLULlama
    state = read_state_dict(str(hf_dir))
    ids = model.tokenizer.encode(PROMPT)
    torch.testing.assert_close(prefill_logits(model, ids), transformers_logits(model, state, ids), rtol=0, atol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_registered_family_runs_through_the_engine(
    gguf_file: tuple[Path, dict[str, torch.Tensor]], backend: str
) -> None:
    """Chunked prefill and batched decode of the new family: the tokens of each sequence run alone."""
    if backend == "cpu" and not native.available():
        pytest.skip("no C compiler for the cpu backend's kernels")
    model = load_gguf(str(gguf_file[0]), dtype="float64", registry=REGISTRY)
    prompts = [model.tokenizer.encode(p) for p in (PROMPT, "Hello world!", "def main():\n    return 42")]
    expected = [greedy(model, ids, 12) for ids in prompts]
    engine = build_engine(compose_config([f"backend={backend}", "engine.max_num_batched_tokens=16"]), model=model)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    finals = engine.run([Request(f"r{i}", ids, params, arrival_time=0.0) for i, ids in enumerate(prompts)])
    assert [list(finals[f"r{i}"].token_ids) for i in range(len(prompts))] == expected


def test_weight_formats_apply_to_any_family_and_leave_their_argument(
    gguf_file: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    exact = load_gguf(str(gguf_file[0]), registry=REGISTRY)
    approx = apply_weight_format(exact, "int8")
    assert type(approx) is GeGLULlama and approx is not exact
    assert all(isinstance(getattr(layer, name), PackedLinear) for layer in approx.layers for name in layer.LINEARS)
    assert all(isinstance(getattr(layer, name), torch.Tensor) for layer in exact.layers for name in layer.LINEARS)
    ids = exact.tokenizer.encode(PROMPT)
    a, b = prefill_logits(exact, ids), prefill_logits(approx, ids)
    assert 0 < ((a - b).norm() / a.norm()).item() < 0.05


def test_registry_refuses_an_architecture_claimed_twice() -> None:
    clash = ModelFamily("clash", GeGLULlama.from_state_dict, hf=HFFormat(("qwen2",), llama.config_from_hf))
    with pytest.raises(ValueError, match="'qwen2' is registered by 'llama' and 'clash'"):
        MODEL_REGISTRY.with_family(clash)
    assert "geglu_llama" not in MODEL_REGISTRY.gguf_architectures  # with_family returned a new registry
    assert REGISTRY.hf_model_types[:3] == ("llama", "mistral", "qwen2")
    assert REGISTRY.hf_model_types == (*MODEL_REGISTRY.hf_model_types, "geglu_llama")
