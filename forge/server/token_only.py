"""A model loaded with ``model.tokenizer=none`` (token ids only): every request field that needs
text is a 400 naming the setting, before anything reaches the engine. Token-id prompts run; their
choices' ``text`` is ``""`` (vLLM's, without a tokenizer) and ``return_token_ids`` gives the ids."""

from __future__ import annotations

from forge.server.grammar import structured_specs
from forge.server.protocol import APIError, CompletionRequest, SamplingFields
from forge.tokenizers.none import SETTING, TokenizerRequired


def needs_tokenizer(what: str, param: str | None) -> APIError:
    return APIError(str(TokenizerRequired(what)), param=param)


def _text_field(body: SamplingFields) -> tuple[str, str] | None:
    """The first field of ``body`` that needs text, with what it is (None: none)."""
    if body.stop_strings():
        return "stop", "a stop string"
    specs = structured_specs(body, None)
    if specs:
        return specs[0][0], "structured output"
    if body.prompt_logprobs is not None:
        return "prompt_logprobs", "prompt_logprobs (token strings)"
    if isinstance(body, CompletionRequest):
        if body.logprobs is not None:
            return "logprobs", "logprobs (token strings)"
        if body.echo:
            return "echo", "echo (the prompt's text)"
    return None


def check_token_only(body: SamplingFields) -> None:
    """400 for the first field of ``body`` that needs a tokenizer."""
    found = _text_field(body)
    if found is not None:
        raise needs_tokenizer(found[1], found[0])


__all__ = ["SETTING", "check_token_only", "needs_tokenizer"]
