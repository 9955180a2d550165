"""The model families forge knows: adding one is its module plus its entry here.

``MODEL_REGISTRY`` is what the loaders (``forge.models.gguf_loader``, ``forge.models.safetensors_loader``)
dispatch through by default; each loader also takes a ``registry`` (e.g.
``MODEL_REGISTRY.with_family(...)``) for families defined elsewhere.
"""

from __future__ import annotations

from forge.models.family import ModelRegistry
from forge.models.gemma3 import GEMMA3
from forge.models.llama import LLAMA
from forge.models.mixtral import MIXTRAL
from forge.models.phi3 import PHI3
from forge.models.qwen3 import QWEN3

MODEL_REGISTRY = ModelRegistry((LLAMA, GEMMA3, QWEN3, MIXTRAL, PHI3))
