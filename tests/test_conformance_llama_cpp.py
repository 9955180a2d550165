"""The llama.cpp conformance harness (benchmarks/conformance_llama_cpp*.py): the launch's option mapping, the
adapter's request rewrites, the classifier and its rules, the report, and the plugin end to end on a
miniature suite shaped like llama.cpp's (``utils.ServerProcess``, the autouse stop fixture) against a
``forge serve tiny`` it starts. The real suite (downloaded from PyPI, tens of minutes) runs only with
``-m conformance``."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import conformance_llama_cpp as harness
from benchmarks.conformance_llama_cpp_adapter import rewrite
from benchmarks.conformance_llama_cpp_classes import Rule, Verdict, classify, counts, load_rules, unused_rules
from benchmarks.conformance_llama_cpp_launch import (
    IGNORED,
    MAPPED,
    OTHER_MODELS,
    UNMAPPED,
    Launch,
    Unmapped,
    launch_for,
)
from benchmarks.conformance_llama_cpp_report import markdown

ROOT = Path(__file__).resolve().parent.parent
# llama.cpp's ServerProcess defaults (tools/server/tests/utils.py) and its tinyllama2 preset's settings
PRESET = {
    **dict.fromkeys([*IGNORED, *MAPPED, *UNMAPPED]),
    "server_host": "127.0.0.1",
    "server_port": 8080,
    "model_hf_repo": "ggml-org/test-model-stories260K",
    "model_alias": "tinyllama-2",
    "n_ctx": 512,
    "n_slots": 2,
    "n_predict": 64,
}


def preset(**changes: Any) -> SimpleNamespace:
    return SimpleNamespace(**{**PRESET, **changes})


def test_a_preset_becomes_forge_serve_with_its_context_slots_and_name(tmp_path: Path) -> None:
    launch = launch_for(preset(), "smollm2", tmp_path)
    assert launch.args == (
        *("smollm2", "--port", "0", "--host", "127.0.0.1", "--max-model-len", "512", "--max-num-seqs", "2"),
        *("--served-model-name", "tinyllama-2"),
    )
    assert launch == launch_for(preset(), "smollm2", tmp_path)  # the pool reuses equal launches
    assert launch.n_predict == 64 and launch.api_key is None
    keyed = launch_for(preset(api_key="k1", n_ctx=8192, model_alias=None), "tiny", tmp_path)
    assert keyed.command()[-2:] == ["--api-key", "k1"] and "4096" in keyed.args and keyed.served_name == "tiny"


def test_a_template_file_inside_the_tests_folder_is_the_servers_template(tmp_path: Path) -> None:
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    launch = launch_for(preset(chat_template_file="t.jinja"), "tiny", tmp_path)
    assert f"server.chat_template={tmp_path / 't.jinja'}" in launch.args
    with pytest.raises(Unmapped, match="not in the extracted llama.cpp tree"):
        launch_for(preset(chat_template_file="../../models/x.jinja"), "tiny", tmp_path)


@pytest.mark.parametrize(
    ("changes", "option"),
    [
        ({"server_reranking": True}, "server_reranking"),
        ({"lora_files": ["a.gguf"]}, "lora_files"),
        ({"server_slots": True}, "server_slots"),
        ({"chat_template": "chatml"}, "chat_template"),
        ({"server_host": "127.0.0.1,::1"}, "server_host"),
        ({"pooling": "cls"}, "pooling"),
        ({"model_hf_repo": "bartowski/Qwen2.5-7B-Instruct-GGUF", "server_slots": True}, "model_file"),  # model first
    ],
)
def test_an_option_forge_serve_lacks_refuses_the_launch_naming_class_and_reason(
    tmp_path: Path, changes: dict[str, Any], option: str
) -> None:
    with pytest.raises(Unmapped) as info:
        launch_for(preset(**changes), "tiny", tmp_path)
    assert info.value.option == option
    verdict = classify({"nodeid": "unit/t.py::x", "outcome": "error", "message": str(info.value)}, ())
    assert (verdict.klass, verdict.source) == (UNMAPPED[option][0], "unmapped")
    assert UNMAPPED[option][1] in verdict.reason


@pytest.mark.parametrize(("repo", "file"), list(OTHER_MODELS))
def test_the_suites_other_models_are_classed_by_what_they_are(tmp_path: Path, repo: str, file: str) -> None:
    """A reranker, a multimodal model, none (router mode): vendor-only, with the reason named."""
    with pytest.raises(Unmapped) as info:
        launch_for(preset(model_hf_repo=repo, model_hf_file=file, server_reranking=True), "tiny", tmp_path)
    verdict = classify({"nodeid": "unit/t.py::x", "outcome": "failed", "message": str(info.value)}, ())
    assert (verdict.klass, verdict.reason.split(": ", 1)[1]) == OTHER_MODELS[(repo, file)]


def test_mapped_ignored_and_unmapped_options_do_not_overlap_except_value_refusals() -> None:
    assert not MAPPED.keys() & IGNORED.keys() and not IGNORED.keys() & UNMAPPED.keys()
    assert MAPPED.keys() & UNMAPPED.keys() == {"server_host", "pooling"}
    assert all(klass in ("vendor-only", "model-specific") and reason for klass, reason in UNMAPPED.values())


def test_requests_get_v1_paths_a_model_and_the_presets_n_predict() -> None:
    launch = Launch(("tiny",), None, "tinyllama-2", 64)
    body: dict[str, Any] = {"messages": [], "model": None}
    path, sent = rewrite(launch, "/chat/completions", body)
    assert (path, sent) == ("/v1/chat/completions", {"messages": [], "model": "tinyllama-2", "max_tokens": 64})
    assert body == {"messages": [], "model": None}  # the test's own dict is left as it was
    assert rewrite(launch, "/v1/completions", {"model": "m", "max_tokens": 3}) == (
        "/v1/completions",
        {"model": "m", "max_tokens": 3},
    )
    assert rewrite(launch, "/v1/embeddings", {"input": "a"})[1] == {"input": "a", "model": "tinyllama-2"}
    assert rewrite(launch, "/models?x=1", None) == ("/v1/models?x=1", None)
    # llama.cpp's own endpoints (its /completions and /embeddings are /completion's and /embedding's
    # aliases) and fields go out as they are
    for native in ("/completion", "/completions", "/embeddings"):
        assert rewrite(launch, native, {"prompt": "a"}) == (native, {"prompt": "a"})
    assert rewrite(launch, "/v1/completions", {"n_predict": 5})[1] == {"n_predict": 5, "model": "tinyllama-2"}


RULES = (
    Rule("unit/test_a.py::*", "vendor-only", "llama.cpp's /slots", match="404"),
    Rule("unit/test_b.py::test_text*", "model-specific", "stories260K's text"),
    Rule("unit/test_never.py::*", "vendor-only", "stale"),
)


def result(nodeid: str, outcome: str, message: str = "", incidents: list[str] | None = None) -> dict[str, Any]:
    return {"nodeid": nodeid, "outcome": outcome, "message": message, "incidents": incidents or []}


def test_failures_are_classed_by_the_first_rule_whose_pattern_and_match_fit() -> None:
    slots = classify(result("unit/test_a.py::test_slots", "failed", "assert 404 == 200"), RULES)
    assert (slots.klass, slots.reason, slots.source) == ("vendor-only", "llama.cpp's /slots", "rule 0")
    other = classify(result("unit/test_a.py::test_slots", "failed", "assert 400 == 200"), RULES)
    assert (other.klass, other.source) == ("forge-bug", "default")  # a different failure is not hidden
    text = classify(result("unit/test_b.py::test_text[1]", "error", "assert match_regex"), RULES)
    assert text.klass == "model-specific"
    assert classify(result("unit/test_c.py::x", "failed", "boom"), RULES).klass == "forge-bug"
    assert classify(result("unit/test_a.py::x", "passed"), RULES).klass == "pass"
    assert classify(result("unit/test_a.py::x", "skipped", "slow"), RULES).reason == "slow"


def test_a_5xx_or_traceback_in_forges_log_is_a_forge_bug_even_when_the_test_passes() -> None:
    incident = ['server log: HTTP/1.1" 500 Internal Server Error']
    for outcome in ("passed", "failed"):
        verdict = classify(result("unit/test_a.py::test_slots", outcome, "assert 404 == 200", incident), RULES)
        assert verdict.klass == "forge-bug" and "500" in verdict.reason


def test_counts_and_stale_rules() -> None:
    verdicts = [
        classify(result("unit/test_a.py::t", "failed", "404"), RULES),
        classify(result("unit/test_a.py::u", "passed"), RULES),
    ]
    assert counts(verdicts) == {"pass": 1, "skipped": 0, "forge-bug": 0, "vendor-only": 1, "model-specific": 0}
    assert unused_rules(verdicts, RULES) == [RULES[1], RULES[2]]


def test_the_committed_rules_load_and_a_rule_without_class_or_reason_is_refused(tmp_path: Path) -> None:
    rules = load_rules()
    assert rules and all(r.tests.startswith("unit/") for r in rules)
    bad = tmp_path / "r.toml"
    bad.write_text('[[rule]]\ntests = "unit/*"\nclass = "flaky"\nreason = "x"\n')
    with pytest.raises(ValueError, match="class must be one of"):
        load_rules(bad)
    bad.write_text('[[rule]]\ntests = "unit/*"\nclass = "vendor-only"\nreason = " "\n')
    with pytest.raises(ValueError, match="with a reason"):
        load_rules(bad)


def test_the_report_lists_counts_and_every_test_that_did_not_pass() -> None:
    verdicts = [
        Verdict("unit/test_a.py::t[a|b]", "failed", "vendor-only", "llama.cpp's /slots", "assert 404 == 200"),
        Verdict("unit/test_a.py::u", "passed", "pass", "", ""),
        Verdict("unit/test_c.py::v", "failed", "forge-bug", "no rule classes this failure", "boom\nline two"),
    ]
    run = {"command": "python -m benchmarks.conformance_llama_cpp", "model": "tiny", "wall_s": 60.0}
    text = markdown(verdicts, RULES, run | {"load": 1.0, "load_after": 2.0, "sdist": "x.tar.gz"})
    assert "| forge-bug | 1 |" in text and "| pass | 1 |" in text and "| total | 3 |" in text
    assert "| unit/test_a.py | 1 | 0 | 0 | 1 | 0 |" in text
    assert "`unit/test_a.py::t[a\\|b]` | failed | vendor-only | llama.cpp's /slots" in text
    assert "boom line two" in text and "unit/test_a.py::u`" not in text
    assert text.index("unit/test_c.py::v") < text.index("unit/test_a.py::t")  # forge bugs first


MINI_UTILS = """
import requests

class ServerResponse:
    pass

class ServerError(Exception):
    pass

class ServerProcess:
    server_port = 8080
    server_host = "127.0.0.1"
    model_hf_repo = "ggml-org/models"
    model_hf_file = "tinyllamas/stories260K.gguf"

    def __init__(self):
        for name in OPTIONS:
            if not hasattr(self, name):
                setattr(self, name, None)

    def start(self, timeout_seconds=60):
        raise AssertionError("llama-server must not be started")

    def stop(self):
        raise AssertionError("the adapter replaces stop")

    def make_request(self, method, path, data=None, headers=None, timeout=None):
        url = f"http://{self.server_host}:{self.server_port}{path}"
        r = requests.request(method, url, json=data, headers=headers, timeout=timeout)
        result = ServerResponse()
        result.status_code, result.body = r.status_code, r.json() if r.content else None
        return result

    def make_stream_request(self, method, path, data=None, headers=None):
        raise AssertionError("not used here")

server_instances = set()

class ServerPreset:
    @staticmethod
    def load_all():
        raise AssertionError("downloads every preset's model")

    @staticmethod
    def tinyllama2():
        server = ServerProcess()
        server.model_alias, server.n_ctx, server.n_slots, server.n_predict = "tinyllama-2", 512, 2, 3
        return server
"""
MINI_CONFTEST = """
import pytest
from utils import *

@pytest.fixture(autouse=True)
def stop_server_after_each_test():
    yield
    for server in set(server_instances):
        server.stop()

@pytest.fixture(scope="session", autouse=True)
def load_server_presets():
    ServerPreset.load_all()
"""
MINI_TESTS = """
from utils import *

def test_chat_without_model_or_max_tokens():
    server = ServerPreset.tinyllama2()
    server.start()
    res = server.make_request("POST", "/chat/completions", data={"messages": [{"role": "user", "content": "hi"}]})
    assert res.status_code == 200, res.body
    assert res.body["model"] == "tinyllama-2" and res.body["usage"]["completion_tokens"] <= 3

def test_slots_endpoint():
    server = ServerPreset.tinyllama2()
    server.start()
    assert server.make_request("GET", "/slots").status_code == 200

def test_reranking():
    server = ServerPreset.tinyllama2()
    server.server_reranking = True
    server.start()
"""


def test_the_plugin_runs_a_llama_cpp_shaped_suite_against_forge_serve_tiny(tmp_path: Path) -> None:
    suite, out = tmp_path / "tests", tmp_path / "out"
    (suite / "unit").mkdir(parents=True)
    options = sorted({*IGNORED, *MAPPED, *UNMAPPED} - {"server_port", "server_host", "model_hf_repo", "model_hf_file"})
    (suite / "utils.py").write_text(f"OPTIONS = {options!r}\n" + MINI_UTILS)
    (suite / "conftest.py").write_text(MINI_CONFTEST)
    (suite / "unit" / "test_mini.py").write_text(MINI_TESTS)
    env = {"FORGE_LLAMA_CPP_OUT": str(out), "FORGE_LLAMA_CPP_MODEL": "tiny", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-p", "benchmarks.conformance_llama_cpp_adapter", "-p", "no:cacheprovider"]
    subprocess.run([*cmd, "-q", "unit"], cwd=suite, env={**os.environ, **env}, timeout=600, check=False)
    results = {r["nodeid"]: r for r in json.loads((out / "results.json").read_text())}
    assert results["unit/test_mini.py::test_chat_without_model_or_max_tokens"]["outcome"] == "passed"
    slots = results["unit/test_mini.py::test_slots_endpoint"]
    assert slots["outcome"] == "failed" and "404" in slots["message"] and slots["incidents"] == []
    assert slots["answers"] == ["GET /slots -> 404 no route GET /slots"]
    rerank = classify(results["unit/test_mini.py::test_reranking"], ())
    assert (rerank.outcome, rerank.klass, rerank.source) == ("failed", "vendor-only", "unmapped")
    logs = list((out / "logs").glob("forge-serve-*.log"))
    assert len(logs) == 1 and '"POST /v1/chat/completions HTTP/1.1" 200' in logs[0].read_text()


@pytest.mark.conformance
def test_llama_cpps_server_tests_show_no_forge_bug(tmp_path: Path) -> None:
    """The whole suite (the sdist is downloaded from PyPI once, into the cache); also that every
    ServerProcess option of the vendored utils.py is mapped, ignored or refused by the launch."""
    cache = harness.default_cache()
    tests_dir = harness.extract_tests(harness.fetch_sdist(cache), cache)
    tree = ast.parse((tests_dir / "utils.py").read_text())
    process = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerProcess")
    options = {t.target.id for t in process.body if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
    assert options - {*MAPPED, *IGNORED, *UNMAPPED} == set()
    status = harness.main(["--model", "tiny", "--out", str(tmp_path)])
    assert status == 0, (tmp_path / "conformance-llama-cpp.md").read_text()


def test_the_sdist_is_pinned_and_only_the_tests_and_templates_are_extracted(tmp_path: Path) -> None:
    fake = tmp_path / "fake.tar.gz"
    with tarfile.open(fake, "w:gz") as tar:
        for name in ("tools/server/tests/utils.py", "models/templates/t.jinja", "src/llama.cpp", "tools/cli/x.py"):
            data = f"# {name}\n".encode()
            info = tarfile.TarInfo(harness.LLAMA_CPP_IN_SDIST + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    cache = tmp_path / "cache"
    with pytest.raises(SystemExit, match="sha256"):
        harness.fetch_sdist(cache, local=fake)
    assert list(cache.iterdir()) == []  # a file that is not the pinned one is not kept
    tests = harness.extract_tests(fake, cache)
    assert (tests / "utils.py").read_text() == "# tools/server/tests/utils.py\n" and (tests / "tmp").is_dir()
    assert (tests / "../../../models/templates/t.jinja").resolve().is_file()
    assert sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file()) == [
        "llama-cpp-0.3.36/models/templates/t.jinja",
        "llama-cpp-0.3.36/tools/server/tests/utils.py",
    ]
