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
        "*",
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
    Rule(
        "*lora*",
        VENDOR,
        "a LoRA adapter as the model (vLLM's --lora-modules): forge serves no adapters and answers 404 for the "
        "adapter's name (the harness stands in empty directories for the adapter downloads)",
        message=r"404 - The model `[\w./-]*(lora|Lora|LoRA)[\w./-]*` does not exist",
    ),
    Rule(
        "*::test_prompt_logprobs_*None]",
        VENDOR,
        "expects prompt_logprobs: null in a response that did not ask for it (vLLM sends the field always); "
        "forge sends this vLLM field only when asked, so the openai client has no such attribute",
        message=r"object has no attribute 'prompt_logprobs'",
    ),
    Rule(
        "chat_completion/test_chat.py::test_custom_role",
        VENDOR,
        "a message role outside OpenAI's (system, developer, user, assistant, tool): vLLM hands any role to "
        "the template; OpenAI answers 400, and so does forge",
        message=r"messages\.0\.role: Input should be",
    ),
    Rule(
        "chat_completion/test_chat.py::test_extra_fields_allowed",
        VENDOR,
        "vLLM ignores unknown fields in a message; forge refuses them with a 400, as OpenAI does (a field is "
        "honoured or refused, never ignored)",
        message=r"Extra inputs are not permitted",
    ),
    Rule(
        "chat_completion/test_chat.py::test_invocations",
        VENDOR,
        "POST /invocations is vLLM's SageMaker-style endpoint, not OpenAI's; forge answers 404",
        message=r"404 Client Error: Not Found for url: http://127\.0\.0\.1:\d+/invocations",
    ),
    Rule(
        "chat_completion/test_chat.py::test_long_seed",
        VENDOR,
        "a seed outside int64 is a 400 in both; the test looks for pydantic's error-type code "
        "('greater_than_equal') in vLLM's message, forge's names the field and its bound in words",
        message=r"400 - seed: Input should be (greater|less) than or equal to",
    ),
    Rule(
        "chat_completion/test_include_reasoning.py::*",
        VENDOR,
        "reasoning output (message.reasoning, include_reasoning) comes from vLLM's --reasoning-parser (qwen3 "
        "here); forge has no reasoning parser: no reasoning field, and include_reasoning is refused with a 400",
        message=r"unsupported field 'include_reasoning'|Expected reasoning content by default",
    ),
    Rule(
        "*",
        VENDOR,
        "a vLLM-only request field (thinking_token_budget: a cap on reasoning tokens; truncate_prompt_tokens: "
        "cut the prompt to its last N tokens); forge refuses a field it does not honour with a 400",
        message=r"unsupported field '(thinking_token_budget|truncate_prompt_tokens)'",
    ),
    Rule(
        "completion/test_completion.py::test_single_completion*",
        VENDOR,
        "reads choices[0].prompt_logprobs, vLLM's extension, which vLLM puts on every choice (null unless asked); "
        "forge adds it only when prompt_logprobs is asked for (docs/serving.md)",
        message=r"has no attribute 'prompt_logprobs'",
    ),
    Rule(
        "completion/test_prompt_validation.py::test_empty_prompt",
        VENDOR,
        "sends prompt: null with prompt_embeds: [] (vLLM's prompt embeddings) and looks for vLLM's message; forge "
        "answers 400 as well (a prompt is a string or token ids)",
        message=r"Actual message: 'Error code: 400 - prompt",
    ),
    Rule(
        "completion/test_prompt_validation.py::test_out_of_vocab_token_ids",
        VENDOR,
        "a token id outside the vocabulary is a 400 in both; the test looks for vLLM's words ('out of "
        "vocabulary'), forge's message says 'outside the vocabulary [0, 49152)'",
        message=r"Actual message: 'Error code: 400 - token id \d+ is outside the vocabulary",
    ),
    Rule(
        "decisions/test_decisions_e2e.py::*",
        VENDOR,
        "POST /v1/decisions is vLLM's own endpoint, not OpenAI's; forge answers 404",
        message=r"404",
    ),
    Rule(
        "models/test_models.py::test_check_models",
        VENDOR,
        "expects the LoRA adapter qwen3-lora listed in /v1/models after the base model; forge serves no adapters "
        "(one model listed)",
        message=r"IndexError: list index out of range",
    ),
    Rule(
        "test_return_token_ids.py::test_basic_completion_with_emoji*",
        VENDOR,
        "expects prompt_token_ids: null in a choice that did not ask for it (vLLM sends the field always); "
        "forge sends this vLLM field only under return_token_ids (tests/test_server_vllm_extras.py)",
        message=r"assert 'prompt_token_ids' in",
    ),
    Rule(
        "*",
        VENDOR,
        "return_tokens_as_token_ids (logprob tokens spelt 'token_id:N') is vLLM's field; forge refuses it with a "
        "400 (its return_token_ids gives the ids)",
        message=r"unsupported field 'return_tokens_as_token_ids'",
    ),
    # -- the model each test names ----------------------------------------------------------------
    Rule(
        "chat_completion/test_thinking_token_budget.py::*",
        MODEL,
        QWEN3_THINKING,
        message=r"chat_template_kwargs: the chat template does not use 'enable_thinking'",
    ),
    Rule(
        "completion/test_completion.py::test_completion_streaming*",
        MODEL,
        "expects 5 tokens and finish_reason 'length' for 'What is an LLM?'; SmolLM2's greedy first token is its "
        "end of sequence (LLM('model=smollm2') gives token 2, finish 'stop'), so 'stop' is right",
        message=r"assert 'stop' == 'length'",
    ),
    Rule(
        "chat_completion/test_chat.py::test_complex_message_content",
        MODEL,
        "expects the answer to 'what is 1+1?' to be exactly '2' (zephyr-7b's); SmolLM2 says more",
        message=r"assert '[^']*' == '2'",
    ),
    Rule(
        "chat_completion/test_chat.py::test_response_format_json_*",
        MODEL,
        'expects the answer {"result": 2} to 1+1; SmolLM2\'s output parses as JSON of the format (the test '
        "checks json.loads first) but is not that answer",
        message=r"== \{'result': 2\}",
    ),
    Rule(
        "chat_completion/test_chat.py::test_more_than_one_prompt_logprobs_chat*",
        MODEL,
        "expects the prompt's 4th token to be zephyr-7b's own top-1 (then top-1 and the token are one entry); "
        "under SmolLM2 it is not, so the entry holds the top-1 and the token (rank 6), as vLLM's format says",
        message=r"assert 2 == 1",
    ),
    Rule(
        "chat_completion/test_chat.py::test_single_chat_session*",
        MODEL,
        "usage with prompt_tokens=37: the message's length in zephyr-7b's tokens (SmolLM2's template and "
        "tokenizer give another count)",
        message=r"assert CompletionUsa",
    ),
    Rule(
        "chat_completion/test_chat.py::test_structured_outputs_choice_chat",
        MODEL,
        "asks the model to pick another option after its first pick (temperature 0.7); SmolLM2 picked the "
        "same one, both within the choice set the test checks first",
        message=r"assert '(\w|[+#])+' != '(\w|[+#])+'",
    ),
    Rule(
        "chat_completion/test_completion_with_function_calling.py::test_named_tool_use",
        MODEL,
        "asks for 'another one with a different name and age'; SmolLM2 answered the same name (both tool "
        "calls' arguments are valid against the schema, which the test checks first)",
        message=r"assert '[^']*' != '[^']*'",
    ),
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
