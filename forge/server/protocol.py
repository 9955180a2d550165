"""OpenAI request bodies (with vLLM's and forge's extras) and the OpenAI error shape.

This module holds the sampling fields completions and chat share and those two bodies. Its parts,
whose names are imported from here: ``protocol_common`` (``APIError``, the refusal of undeclared
fields, ``Strict``, the int64 bounds), ``protocol_messages`` (chat messages and tool definitions) and
``protocol_endpoints`` (the bodies of ``/tokenize``, ``/detokenize``, ``/v1/batches``, ``/generate``
and ``/v1/embeddings``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from forge.core.sampling_params import (
    PENALTY_MAX,
    REPETITION_PENALTY_MAX,
    REPETITION_PENALTY_MIN,
    SEED_MAX,
    SEED_MIN,
    TEMPERATURE_MIN,
)
from forge.server.protocol_common import (
    HARMLESS_FIELDS,
    INT64_MAX,
    INT64_MIN,
    APIError,
    Strict,
    TokenId,
    refuse_unknown_fields,
)
from forge.server.protocol_endpoints import (
    CreateBatchRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    GenerateRequest,
    TokenizeRequest,
)
from forge.server.protocol_messages import (
    ChatMessage,
    ContentPart,
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    ToolCall,
    ToolCallFunction,
    ToolDef,
)

__all__ = [
    "HARMLESS_FIELDS",
    "INT64_MAX",
    "INT64_MIN",
    "LOGIT_BIAS_MAX",
    "SERVED_TEMPERATURE_MAX",
    "APIError",
    "Bias",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "CreateBatchRequest",
    "DetokenizeRequest",
    "EmbeddingRequest",
    "FunctionDef",
    "GenerateRequest",
    "JSONSchemaFormat",
    "NamedFunction",
    "NamedToolChoice",
    "Penalty",
    "ResponseFormat",
    "SamplingFields",
    "StreamOptions",
    "Strict",
    "StructuredOutputs",
    "TokenId",
    "TokenizeRequest",
    "ToolCall",
    "ToolCallFunction",
    "ToolDef",
    "refuse_unknown_fields",
]

# OpenAI's bound (the library's SamplingParams allows up to TEMPERATURE_MAX).
SERVED_TEMPERATURE_MAX = 2.0
LOGIT_BIAS_MAX = 100.0
Penalty = Annotated[float, Field(ge=-PENALTY_MAX, le=PENALTY_MAX, allow_inf_nan=False)]
Bias = Annotated[float, Field(ge=-LOGIT_BIAS_MAX, le=LOGIT_BIAS_MAX, allow_inf_nan=False)]


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JSONSchemaFormat(Strict):
    model_config = ConfigDict(populate_by_name=True, strict=True, extra="forbid")
    name: str = "output"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    """``json_object`` may carry a ``schema`` (llama.cpp's form): the object must match it."""

    model_config = ConfigDict(populate_by_name=True, strict=True, extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class StructuredOutputs(Strict):
    """vLLM's ``structured_outputs`` object: exactly one of its fields."""

    json_: dict[str, Any] | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None
    model_config = ConfigDict(populate_by_name=True, strict=True, extra="forbid")


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions (strict types: "5" is not an int)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    min_tokens: int = Field(default=0, ge=0, le=INT64_MAX)
    include_stop_str_in_output: bool = False
    max_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=SERVED_TEMPERATURE_MAX,
        allow_inf_nan=False,
        description=f"0 (greedy) or in [{TEMPERATURE_MIN}, {SERVED_TEMPERATURE_MAX}]; tinier values are refused",
    )
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=-1, le=INT64_MAX, description="-1 or 0: off")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: float = Field(
        default=1.0, ge=REPETITION_PENALTY_MIN, le=REPETITION_PENALTY_MAX, allow_inf_nan=False
    )
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    n: int = Field(default=1, ge=1, le=INT64_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    prompt_logprobs: int | None = Field(default=None, ge=0, le=INT64_MAX)  # vLLM's: per prompt token, top-k
    user: str | None = None
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, Bias] | None = None
    # forge / vLLM extras
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    json_schema: dict[str, Any] | bool | None = None
    regex: str | None = None
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    structured_outputs: StructuredOutputs | None = None
    allowed_token_ids: list[TokenId] | None = None  # vLLM's: sampling restricted to these ids
    return_token_ids: bool = False  # vLLM's: the prompt's and each choice's token ids in the answer

    def check_known_fields(self) -> None:
        """Undeclared fields are refused (a field accepted and ignored would change what the
        client gets without telling it), except OpenAI's bookkeeping ones (HARMLESS_FIELDS)."""
        refuse_unknown_fields(self)

    @field_validator("temperature")
    @classmethod
    def _temperature_not_tiny(cls, value: float | None) -> float | None:
        if value is not None and 0.0 < value < TEMPERATURE_MIN:
            raise ValueError(f"temperature must be 0 (greedy) or >= {TEMPERATURE_MIN}")
        return value

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=INT64_MAX)
    best_of: int | None = Field(default=None, ge=1, le=INT64_MAX)
    suffix: str | None = None
    # vLLM's beam search extension: ``n`` results of a beam search of width ``n`` (forge also takes
    # ``beam_width``, which then sets both); ``early_stopping`` as vLLM V0's (see BeamSearchParams)
    use_beam_search: bool = False
    beam_width: int | None = Field(default=None, ge=1, le=INT64_MAX)
    length_penalty: float = Field(default=1.0, ge=-100.0, le=100.0, allow_inf_nan=False)
    early_stopping: bool = False


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, le=INT64_MAX)  # >= 1: checked as max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=INT64_MAX)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: extra variables for the chat template
