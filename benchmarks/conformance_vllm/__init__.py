"""vLLM's own OpenAI-server tests (vLLM 0.33.0's ``tests/entrypoints/openai``) run against ``forge serve``.

    python -m benchmarks.conformance_vllm [--output-dir reports/serve] [--files PATTERN ...]

The suite's sources come from vLLM's sdist on PyPI (pinned by sha256, cached under
``$FORGE_CACHE_DIR/vllm-suite``); its ``tests/utils.py`` is replaced by a shim whose
``RemoteOpenAIServer`` starts ``forge serve smollm2`` with vLLM's serve flags mapped onto forge's,
and ``vllm.*`` imports resolve to stand-ins that raise when a test calls vLLM's own Python code.
Every test's outcome is classed (pass, forge bug, vendor-only, model-specific, not applicable)
by the rules in ``benchmarks/conformance_vllm/rules.py``; docs/conformance.md says how to read it.
"""
