"""``GET /version`` (vLLM's route): forge's package version and the git commit it runs from.

``{"version": "0.1.0", "commit": "4ca1b97"}``: ``version`` as in vLLM's answer (the installed
``forge`` distribution's, ``importlib.metadata``); ``commit`` the short commit of the checkout
forge's code is in, ``+dirty`` when its tracked files have changes, ``unknown`` outside a git
checkout (the same helper the run summary's ``commit`` uses). Not behind the API key, like
``/health``; answers HEAD too."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from fastapi import APIRouter

from forge.results.provenance import git_commit

DISTRIBUTION = "forge"


def forge_version() -> str:
    """The installed forge distribution's version (``unknown`` when forge runs uninstalled)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def version_router() -> APIRouter:
    """The route; the answer is computed on the first request (git runs once, not at startup)."""
    router = APIRouter()
    answer: dict[str, str] = {}

    def current() -> dict[str, str]:  # a sync route: FastAPI runs it (and git) off the event loop
        if not answer:
            answer.update(version=forge_version(), commit=git_commit(Path(__file__).resolve().parent))
        return answer

    router.add_api_route("/version", current, methods=["GET"])
    router.add_api_route("/version", current, methods=["HEAD"], include_in_schema=False)
    return router
