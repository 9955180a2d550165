"""OpenAI-compatible HTTP serving over the engine (``python run.py mode=serve``).

The top of the stack with ``forge.llm`` and ``forge.main``: it drives ``forge.engine`` from its own thread
and nothing in forge imports it."""
