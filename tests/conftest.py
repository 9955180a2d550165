from __future__ import annotations

import pytest

from forge import LLM, SamplingParams


def make_llm(*overrides: str) -> LLM:
    return LLM(*overrides)


@pytest.fixture
def greedy() -> SamplingParams:
    return SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
