"""What drives the engine from above: the library (``forge.llm``) and the server hand it their
requests, and a request the engine does not run itself runs here over plain engine requests —
beam search (``BeamSearchFrontend``: each beam an ordinary request, forked onto its parent's KV
blocks with ``Engine.fork``), as vLLM V1 runs beam search in its frontend.

Imports ``forge.core``, ``forge.sched`` (output ids) and ``forge.engine``; the entry points and the
server import it, the engine never does."""

from forge.frontend.beam_search import BeamSearchFrontend

__all__ = ["BeamSearchFrontend"]
