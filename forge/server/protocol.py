"""OpenAI request bodies (with vLLM's and forge's extras) and the OpenAI error shape."""

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

# OpenAI's bound (the library's SamplingParams allows up to TEMPERATURE_MAX).
SERVED_TEMPERATURE_MAX = 2.0
LOGIT_BIAS_MAX = 100.0
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
Penalty = Annotated[float, Field(ge=-PENALTY_MAX, le=PENALTY_MAX, allow_inf_nan=False)]
Bias = Annotated[float, Field(ge=-LOGIT_BIAS_MAX, le=LOGIT_BIAS_MAX, allow_inf_nan=False)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]


class APIError(Exception):
    """Answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# OpenAI fields that change nothing forge returns (bookkeeping for OpenAI's platform): accepted
# and ignored. Any other field a request model does not declare is refused with a 400 naming it.
HARMLESS_FIELDS = frozenset({"user", "metadata", "store", "service_tier"})


def refuse_unknown_fields(body: BaseModel) -> None:
    """A 400 naming the first field ``body`` does not declare, unless it is one of HARMLESS_FIELDS."""
    unknown = sorted(set(body.model_extra or {}) - HARMLESS_FIELDS)
    if unknown:
        shown = unknown[0][:64]
        raise APIError(f"unsupported field {shown!r}", param=shown, code="unsupported_field")


class Strict(BaseModel):
    """A request part: strict types ("5" is not an int) and unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid")


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


class ContentPart(Strict):
    type: str
    text: str | None = None


class ToolCallFunction(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class FunctionDef(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.type != "text" or p.text is None:
                raise APIError(f"content part type {p.type!r} is not supported (text only)", param="messages")
            parts.append(p.text)
        return "".join(parts)


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


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize`` body (strict types; other fields refused, as ``SamplingFields``')."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolDef] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    def check_known_fields(self) -> None:
        refuse_unknown_fields(self)


class DetokenizeRequest(BaseModel):
    """vLLM's ``/detokenize`` body: token ids are integers ("5", 5.0 and true are not)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    tokens: list[int]

    def check_known_fields(self) -> None:
        refuse_unknown_fields(self)


class CreateBatchRequest(Strict):
    """POST /v1/batches."""

    input_file_id: str = Field(max_length=128)
    endpoint: str = Field(max_length=128)
    completion_window: str = Field(max_length=16)
    metadata: dict[str, str] | None = None


class GenerateRequest(Strict):
    """POST /generate (forge-infer's shape): a prompt and at most ``max_tokens`` greedy tokens."""

    prompt: str
    max_tokens: int = Field(default=32, ge=1, le=INT64_MAX)


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings body: ``input`` a string, strings, token ids or lists of token ids;
    ``encoding_format`` ``float`` or ``base64`` (little-endian float32); ``dimensions`` only as the
    model's own size (its output is not Matryoshka-trained, so truncation is refused)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=INT64_MAX)
    user: str | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)  # vLLM's extension, as in completions

    def check_known_fields(self) -> None:
        """As ``SamplingFields.check_known_fields``."""
        refuse_unknown_fields(self)
