"""pytest plugin that runs llama.cpp's server tests against ``forge serve``.

``python -m benchmarks.conformance_llama_cpp`` runs pytest inside the extracted ``tools/server/tests``
folder with ``-p benchmarks.conformance_llama_cpp_adapter``. The vendored files are not edited; the
plugin replaces, on their ``utils.ServerProcess``:

- ``start``: the forge server ``launch_for`` maps the test's llama-server options to (from a
  ``ServerPool``); the test's ``server_port`` becomes that server's port. ``ServerPreset.load_all``
  (which downloads every preset's model) does nothing.
- ``stop``: the server goes back to the pool.
- ``make_request`` / ``make_stream_request``: two rewrites a client configured for forge would make
  itself (``rewrite``): llama-server's unprefixed OpenAI paths (``/chat/completions``, ``/models``)
  get ``/v1``; an OpenAI request without ``model`` names the served model, and one without
  ``max_tokens`` gets the preset's ``n_predict`` (llama-server's ``--n-predict``, a server-wide default
  forge does not have). Requests through the ``openai`` client go out unchanged. Every answer of
  400 or more is noted (``answers``: method, path, status, the error's message) for the classifier.

``wget`` (imported by ``utils.py``, used only to download models and images) is replaced by a module
that refuses to download, and HTTP(S) goes through a proxy address that refuses (127.0.0.1:9) but for
127.0.0.1, so a test that fetches from the internet fails at once. Each test's outcome, failure
message and the servers' incidents (5xx, tracebacks, exits: ``ServerPool.incidents``) are written
to ``results.json`` in ``$FORGE_LLAMA_CPP_OUT``; the harness classifies them."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from benchmarks.conformance_llama_cpp_launch import Launch, launch_for
from benchmarks.conformance_llama_cpp_pool import ServerPool

# llama-server's unprefixed aliases of its OpenAI routes (its /completions and /embeddings are its
# own formats, aliases of /completion and /embedding, so they are not rewritten)
OAI_ALIASES = {"/chat/completions": "/v1/chat/completions", "/models": "/v1/models"}
OAI_POSTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")
NO_PROXY_FOR_LOOPBACK = {
    **dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), "http://127.0.0.1:9"),
    **dict.fromkeys(("NO_PROXY", "no_proxy"), "127.0.0.1,localhost"),
}


def rewrite(launch: Launch, path: str, data: Any) -> tuple[str, Any]:
    """The request a client configured for forge sends in place of ``path`` and ``data``."""
    route, sep, query = path.partition("?")
    route = OAI_ALIASES.get(route, route)
    if route in OAI_POSTS and isinstance(data, dict):
        data = dict(data)
        if data.get("model") is None:
            data["model"] = launch.served_name
        no_length = all(data.get(f) is None for f in LENGTH_FIELDS)
        if route != "/v1/embeddings" and no_length and launch.n_predict:
            data = {k: v for k, v in data.items() if k not in LENGTH_FIELDS} | {"max_tokens": launch.n_predict}
    return route + sep + query, data


def _no_download(*args: Any, **kwargs: Any) -> NoReturn:
    raise RuntimeError("forge-conformance: the harness downloads nothing (llama.cpp's wget.download)")


def _failure_message(report: pytest.TestReport) -> str:
    """The failure's message, without what changes from run to run (object addresses, pytest's
    numbered temporary folders), so that two reports differ only where the outcomes do."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    text = re.sub(r" at 0x[0-9a-f]+>", ">", text)
    return re.sub(r"/pytest-of-[^/]+/pytest-\d+/", "/pytest-of-USER/pytest-N/", text)[:500]


class LlamaCppAdapter:
    """The plugin object: patches ``utils``, keeps the pool and the results."""

    def __init__(self, model: str, tests_dir: Path, out_dir: Path) -> None:
        self.model = model
        self.tests_dir = tests_dir
        self.out_dir = out_dir
        self.pool = ServerPool(out_dir / "logs", keep=4 if model == "tiny" else 2)
        self.results: dict[str, dict[str, Any]] = {}
        self.answers: list[str] = []  # this test's refused requests

    def note(self, method: str, path: str, status: int, body: Any) -> None:
        if status >= 400 and len(self.answers) < 20:
            error = body.get("error") if isinstance(body, dict) else None
            message = error.get("message") if isinstance(error, dict) else str(body)
            self.answers.append(f"{method} {path.partition('?')[0]} -> {status} {str(message)[:200]}")

    def start(self, server: Any) -> None:
        launch = launch_for(server, self.model, self.tests_dir)
        pooled = self.pool.acquire(launch)
        server.server_host, server.server_port = "127.0.0.1", pooled.port
        server.forge_launch = launch
        server.process = None  # tests never get the pooled process to stop
        sys.modules["utils"].server_instances.add(server)

    def stop(self, server: Any) -> None:
        sys.modules["utils"].server_instances.discard(server)

    def install(self, utils: Any) -> None:
        adapter = self
        original_request, original_stream = utils.ServerProcess.make_request, utils.ServerProcess.make_stream_request

        def start(server: Any, timeout_seconds: int = 0) -> None:
            adapter.start(server)

        def stop(server: Any) -> None:
            adapter.stop(server)

        def make_request(server: Any, method: str, path: str, data: Any = None, *args: Any, **kw: Any) -> Any:
            path, data = rewrite(server.forge_launch, path, data) if hasattr(server, "forge_launch") else (path, data)
            res = original_request(server, method, path, data, *args, **kw)
            adapter.note(method, path, res.status_code, res.body)
            return res

        def make_stream_request(server: Any, method: str, path: str, data: Any = None, *a: Any, **kw: Any) -> Any:
            path, data = rewrite(server.forge_launch, path, data) if hasattr(server, "forge_launch") else (path, data)
            try:
                yield from original_stream(server, method, path, data, *a, **kw)
            except utils.ServerError as e:
                adapter.note(method, path, e.code, e.body)
                raise

        utils.ServerProcess.start, utils.ServerProcess.stop = start, stop
        utils.ServerProcess.make_request, utils.ServerProcess.make_stream_request = make_request, make_stream_request
        utils.ServerPreset.load_all = staticmethod(lambda: None)

    def _entry(self, nodeid: str) -> dict[str, Any]:
        empty = {"nodeid": nodeid, "outcome": "passed", "message": "", "answers": [], "incidents": []}
        return self.results.setdefault(nodeid, empty)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        self.pool.incidents()  # anything logged between tests belongs to no test
        self.answers = []
        yield
        entry = self._entry(item.nodeid)
        entry["incidents"] += self.pool.incidents()
        entry["answers"] = self.answers

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self._entry(report.nodeid)
        if report.skipped and entry["outcome"] == "passed":
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            entry.update(outcome="skipped", message=str(reason)[:500])
        elif report.failed and entry["outcome"] in ("passed", "skipped"):
            entry.update(outcome="failed" if report.when == "call" else "error", message=_failure_message(report))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.pool.close()
        rows = sorted(self.results.values(), key=lambda r: str(r["nodeid"]))
        (self.out_dir / "results.json").write_text(json.dumps(rows, indent=1) + "\n")


def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """Before the vendored conftest imports ``utils`` (which imports ``wget``)."""
    try:
        import wget  # noqa: F401
    except ImportError:
        stub = types.ModuleType("wget")
        stub.download = _no_download  # type: ignore[attr-defined]
        sys.modules["wget"] = stub


def pytest_configure(config: pytest.Config) -> None:
    # a test that fetches from the internet (images, models) fails at once: a proxy that refuses
    os.environ.update(NO_PROXY_FOR_LOOPBACK)
    tests_dir = Path.cwd()
    out_dir = Path(os.environ["FORGE_LLAMA_CPP_OUT"])
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    adapter = LlamaCppAdapter(os.environ.get("FORGE_LLAMA_CPP_MODEL", "smollm2"), tests_dir, out_dir)
    sys.path.insert(0, str(tests_dir))
    import utils  # llama.cpp's tests/utils.py (the tests folder is the working directory)

    adapter.install(utils)
    config.pluginmanager.register(adapter, "forge-llama-cpp-adapter")
