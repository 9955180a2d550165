"""The harness that runs vLLM's OpenAI-server tests against forge serve (benchmarks/conformance_vllm,
docs/conformance.md): how it classes outcomes, maps vLLM's serve flags, stands in for ``vllm``, and
fetches the suite (CI-safe: no server, no download); and, under ``-m conformance``, the run itself."""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.conformance_vllm import source
from benchmarks.conformance_vllm.classify import BUG, MODEL, PASS, SKIPPED, VENDOR, Rule, verdicts
from benchmarks.conformance_vllm.flags import serve_args
from benchmarks.conformance_vllm.report import markdown
from benchmarks.conformance_vllm.rules import RULES
from benchmarks.conformance_vllm.server import vllm_args

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "reports" / "serve" / "conformance-vllm.csv"
PREFIX = "tests/entrypoints/openai/"
RULE = Rule("completion/test_x.py::test_lora*", VENDOR, "LoRA adapters: forge serves none", message="lora")


def record(test: str, outcome: str, message: str = "") -> dict[str, str]:
    return {"id": PREFIX + test, "outcome": outcome, "phase": "call", "message": message}


def test_a_failure_no_rule_explains_is_a_forge_bug() -> None:
    (v,) = verdicts([record("completion/test_x.py::test_echo", "failed", "assert 1 == 2")], [RULE])
    assert (v.test_id, v.klass, v.message) == ("completion/test_x.py::test_echo", BUG, "assert 1 == 2")


def test_a_rule_classes_only_the_failures_whose_id_and_message_it_matches() -> None:
    found = verdicts(
        [
            record("completion/test_x.py::test_lora_a", "failed", "400 - unknown model 'lora-1'"),
            record("completion/test_x.py::test_lora_b", "failed", "500 Internal Server Error"),  # not the message
            record("completion/test_x.py::test_other", "failed", "lora"),  # not the id
        ],
        [RULE],
    )
    bug = (BUG, "no rule explains this failure")
    assert [(v.klass, v.reason) for v in found] == [(VENDOR, RULE.reason), bug, bug]


def test_passes_skips_and_calls_into_vllm_code_are_classed_without_rules() -> None:
    internal = "VllmInternalUsed: the test calls vLLM's own vllm.tokenizers.get_tokenizer"
    raises = "ValueError: Expected a BaseException type, but got 'vllm.exceptions.VLLMValidationError'"
    found = verdicts(
        [
            record("a.py::test_pass", "passed"),
            record("a.py::test_skip", "skipped", "needs 2 GPUs"),
            record("a.py::test_internal", "error", internal),
            record("a.py::test_raises", "failed", raises),
        ],
        [],
    )
    by_id = {v.test_id: v for v in found}
    assert by_id["a.py::test_pass"].klass == PASS and by_id["a.py::test_skip"].klass == SKIPPED
    assert (
        by_id["a.py::test_internal"].klass == VENDOR
        and "vllm.tokenizers.get_tokenizer" in by_id["a.py::test_internal"].reason
    )
    assert by_id["a.py::test_raises"].klass == VENDOR and "VLLMValidationError" in by_id["a.py::test_raises"].reason


def test_a_failure_recorded_after_a_pass_wins() -> None:
    (v,) = verdicts([record("a.py::t", "passed"), record("a.py::t", "error", "teardown leak")], [])
    assert (v.outcome, v.klass) == ("error", BUG)


def test_the_table_names_every_test_that_did_not_pass_with_its_reason() -> None:
    found = verdicts(
        [record("a.py::test_pass", "passed"), record("completion/test_x.py::test_lora_a", "failed", "lora")], [RULE]
    )
    not_run = [("b.py::test_fuzz", "hours of fuzzing")]
    text = markdown(found, {"command": "python -m benchmarks.conformance_vllm", "commit": "abc"}, not_run)
    assert "| b.py::test_fuzz | hours of fuzzing |" in text.split("## Not run")[1]
    assert "| vendor-only | 1 |" in text and "| pass | 1 |" in text and "| forge bug | 0 |" in text
    assert f"| completion/test_x.py::test_lora_a | failed | vendor-only | {RULE.reason} |" in text
    assert "a.py::test_pass |" not in text.split("## Every test that did not pass")[1]


def test_vllm_serve_flags_become_forge_serve_arguments() -> None:
    args = serve_args(
        "Qwen/Qwen3-0.6B",
        [
            *["--max-model-len", "2048", "--enforce-eager", "--enable-lora", "--lora-modules", "a=b", "c=d"],
            *["--tool-call-parser", "hermes", "--no-enable-prefix-caching", "--seed", "0", "--port", "9"],
        ],
        port=1234,
    )
    assert args.argv == [
        "smollm2",
        "--port",
        "1234",
        "--host",
        "127.0.0.1",
        "server.served_model_name=Qwen/Qwen3-0.6B",
        "engine.max_model_len=2048",
        "server.tool_call_parser=hermes",
        "kvcache.enable_prefix_caching=false",
        "seed=0",
    ]
    assert args.dropped == ["--enable-lora", "--lora-modules a=b c=d"]
    named = serve_args("m", ["--served-model-name", "alias", "--reasoning-parser=qwen3"], port=1, forge_model="tiny")
    assert named.argv[0] == "tiny" and "server.served_model_name=alias" in named.argv
    assert named.dropped == ["--reasoning-parser qwen3"]


STUB_PROBE = """
from benchmarks.conformance_vllm.stub import Switch, VllmInternalUsed, install
switch = Switch()
install(switch)
from vllm.platforms import current_platform
from vllm.sampling_params import SamplingParams
assert not current_platform.is_rocm()        # importing: calls answer a falsy stand-in
switch.strict = True
try:
    SamplingParams(max_tokens=1)
except VllmInternalUsed as exc:
    print(exc)
from vllm.transformers_utils.repo_utils import hf_api  # LoRA adapters: an empty directory each
print(hf_api().snapshot_download(repo_id="org/adapter").endswith("forge-vllm-suite-adapters/org/adapter"))
"""


def test_vllm_imports_resolve_and_a_call_into_vllm_fails_naming_it() -> None:
    out = subprocess.run([sys.executable, "-c", STUB_PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == [
        "VllmInternalUsed: the test calls vLLM's own vllm.sampling_params.SamplingParams",
        "True",
    ]


def sdist_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("vllm-9/tests/entrypoints/openai/test_a.py", "vllm-9/vllm/engine.py"):
            data = b"x = 1\n"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_the_sdist_is_cached_only_with_the_pinned_sha256_and_only_tests_are_extracted(tmp_path: Path) -> None:
    data = sdist_bytes()
    origin = tmp_path / "origin" / "vllm-9.tar.gz"
    origin.parent.mkdir()
    origin.write_bytes(data)
    cache = tmp_path / "cache"
    with pytest.raises(SystemExit, match="sha256"):
        source.sdist(cache, url=origin.as_uri(), sha256="0" * 64)
    assert not list(cache.iterdir())  # nothing kept
    got = source.sdist(cache, url=origin.as_uri(), sha256=hashlib.sha256(data).hexdigest())
    assert got == cache / "vllm-9.tar.gz" and got.read_bytes() == data
    tree = source.extract_tests(got, tmp_path / "run")
    files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
    assert files == ["tests/entrypoints/openai/test_a.py"]


def test_every_rule_has_a_reason_and_a_class_and_matches_a_test_of_the_committed_table() -> None:
    with TABLE.open() as f:
        ids = [row["test_id"] for row in csv.DictReader(f)]
    for rule in RULES:
        assert rule.klass in (VENDOR, MODEL) and len(rule.reason) > 20, rule
        assert any(fnmatch.fnmatchcase(i, rule.pattern) for i in ids), f"stale rule: {rule.pattern}"


def test_the_committed_table_shows_no_forge_bug() -> None:
    table = json.loads(TABLE.with_suffix(".json").read_text())
    assert table["counts"].get(BUG, 0) == 0, [t["test_id"] for t in table["tests"] if t["klass"] == BUG]
    assert sum(table["counts"].values()) == len(table["tests"]) > 500


@pytest.mark.conformance
def test_vllms_openai_suite_shows_no_forge_bug(tmp_path: Path) -> None:
    """The whole run (an hour or more on a 2-core machine):
    python -m pytest -m conformance tests/test_conformance_vllm.py"""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.conformance_vllm",
        "--output-dir",
        str(tmp_path),
        "--workdir",
        str(tmp_path / "run"),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    table = json.loads((tmp_path / "conformance-vllm.json").read_text())
    assert done.returncode == 0 and table["counts"].get(BUG, 0) == 0, done.stdout + done.stderr


def test_what_vllm_serve_takes_by_default_is_made_explicit() -> None:
    assert vllm_args(["--dtype", "half"], {"VLLM_API_KEY": "k"}, "smollm2") == [
        *["--dtype", "half", "--api-key", "k", "--max-model-len", "8192"]
    ]
    assert vllm_args(["--max-model-len=512"], {}, "smollm2") == ["--max-model-len=512"]
    assert vllm_args([], {}, "tiny") == []


@pytest.mark.parametrize(
    "message",
    [
        "AttributeError: <vllm.vllm.entrypoints.openai.chat_completion.serving.OpenAIServingChat object at 0x7f>"
        " has no attribute '_make_parser'",
        "AttributeError: 'vllm.entrypoints.openai.chat_completion.serving.Op' object has no attribute 'x'",
        "TypeError: unsupported operand type(s) for +: '_Meta' and 'int'",
    ],
)
def test_a_failure_on_a_stand_in_object_is_a_call_into_vllm(message: str) -> None:
    (v,) = verdicts([record("a.py::t", "failed", message)], [])
    assert v.klass == VENDOR and "vLLM's own Python code" in v.reason
