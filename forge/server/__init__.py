"""OpenAI-compatible HTTP serving over the engine (``python run.py mode=serve``)."""
