"""forge: a research testbed for LLM inference serving."""

from forge.core.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> object:
    if name == "LLM":  # lazy: importing forge must not pay for torch + hydra
        from forge.llm import LLM

        return LLM
    raise AttributeError(name)
