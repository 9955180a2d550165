"""Why each test of vLLM's suite that does not pass is not a forge bug: (test id pattern, failure message
regex) -> class and reason, first match wins. A failure no rule matches is a forge bug (classify.py).
A rule names the failure it expects (``message``) wherever a test could also fail for another reason, so
that a new failure of the same test is not hidden behind an old reason."""

from __future__ import annotations

from benchmarks.conformance_vllm.classify import MODEL, VENDOR, Rule

ENDPOINTS = "forge serves /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, files, batches, /tokenize"
QWEN3_THINKING = (
    "sends chat_template_kwargs.enable_thinking, a variable of Qwen3's chat template; SmolLM2's template has "
    "none, and forge refuses a key the template does not read (400 naming it, issue 37)"
)

# Tests the harness deselects (pytest --deselect), with why: listed in the table as not run.
NOT_RUN: tuple[tuple[str, str], ...] = (
    (
        "test_openai_schema.py::test_openapi_stateless",
        "schemathesis fuzzing of every operation of the server's OpenAPI document, 50 examples each, generating "
        "on SmolLM2: hours on a 2-core machine; forge fuzzes its own OpenAPI document in CI "
        "(tests/test_server_schemathesis.py)",
    ),
)

RULES: tuple[Rule, ...] = (
    # -- features of vLLM that forge does not claim ------------------------------------------------
    Rule("responses/*", VENDOR, f"the Responses API (/v1/responses): {ENDPOINTS}, no Responses API"),
    Rule("parser/*", VENDOR, "gpt-oss's Harmony format (openai_harmony): forge serves no Harmony model"),
    Rule(
        "*prompt_embeds*",
        VENDOR,
        "prompt embeddings as input (vLLM's --enable-prompt-embeds): forge takes text or token ids only",
    ),
    Rule(
        "chat_completion/test_batched_chat_completions.py::*",
        VENDOR,
        "POST /v1/chat/completions/batch is vLLM's own endpoint, not OpenAI's; forge answers 404",
        message=r"no route POST /v1/chat/completions/batch",
    ),
    Rule(
        "chat_completion/test_chat_completion.py::test_kv_transfer_*",
        VENDOR,
        "kv_transfer_params is vLLM's KV-connector field (disaggregated prefill); forge refuses it with a 400",
        message=r"unsupported field 'kv_transfer_params'",
    ),
    Rule(
        "chat_completion/test_chat_completion.py::test_per_request_metrics_*",
        VENDOR,
        "vLLM's --enable-per-request-metrics adds a 'metrics' object to responses; forge has no such field "
        "(its metrics are GET /metrics)",
    ),
    Rule(
        "chat_completion/test_chat_echo.py::test_*_logprobs",
        VENDOR,
        "logprobs -1 is vLLM's 'the whole vocabulary' (with --max-logprobs at the vocabulary size); OpenAI's "
        "top_logprobs is 0-20 and forge refuses -1 with a 400",
        message=r"(prompt_logprobs|top_logprobs): Input should be greater than or equal to 0",
    ),
    Rule(
        "correctness/test_lmeval.py",
        MODEL,
        "GSM8K accuracy of Qwen2-1.5B-Instruct through lm_eval (not installed; the data set is not reachable here)",
        message=r"No module named 'lm_eval'",
    ),
    Rule(
        "chat_completion/test_logprob_token_ids.py::*",
        VENDOR,
        "logprob_token_ids (logprobs of chosen token ids) is a vLLM-only field; forge refuses it with a 400",
        message=r"unsupported field 'logprob_token_ids'",
    ),
    Rule(
        "chat_completion/test_root_path.py::*",
        VENDOR,
        "vLLM's --root-path serves the API under a prefix (/llm/v1) for a proxy; forge has no such setting "
        "and answers 404 there",
        message=r"no route POST /llm/v1/chat/completions",
    ),
    Rule(
        "chat_completion/test_enable_force_include_usage.py::*",
        VENDOR,
        "vLLM's --enable-force-include-usage sends usage without stream_options.include_usage; forge sends "
        "usage when the request asks (OpenAI's behaviour)",
        message=r"'NoneType' object has no attribute '(prompt_tokens|completion_tokens|total_tokens)'",
    ),
    Rule(
        "chat_completion/test_serving_chat.py::TestGPTOSSChat::test_gpt_oss_tool_message_array_content*",
        VENDOR,
        "a role 'tool' message without tool_call_id: OpenAI's API requires the field (400), vLLM's Harmony "
        "path takes it; forge answers as OpenAI does",
        message=r"a tool message needs the tool_call_id",
    ),
    # -- the model each test names ----------------------------------------------------------------
    Rule(
        "chat_completion/test_serving_chat.py::TestGPTOSSChat::*",
        MODEL,
        "gpt-oss-20b's Harmony tool calls and answers: SmolLM2-135M (served under its name) answers in plain "
        "text and calls no tool",
    ),
    Rule(
        "chat_completion/test_extra_content_fields.py::*",
        MODEL,
        "TranslateGemma's chat template reads source_lang_code/target_lang_code from content parts and the test "
        "checks its Spanish; forge refuses unknown content-part fields with a 400 (its templates read none)",
        message=r"messages\.0\.content",
    ),
    Rule(
        "chat_completion/test_completion_with_function_calling.py::*",
        MODEL,
        QWEN3_THINKING,
        message=r"chat_template_kwargs: the chat template does not use 'enable_thinking'",
    ),
)
