"""forge: a research testbed for LLM inference serving."""

from typing import TYPE_CHECKING

from forge.core.sampling_params import SamplingParams

if TYPE_CHECKING:  # for type checkers; at run time LLM is imported on first use (__getattr__)
    from forge.llm import LLM

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> object:
    if name == "LLM":  # lazy: importing forge must not pay for torch + hydra
        from forge.llm import LLM

        return LLM
    raise AttributeError(name)
