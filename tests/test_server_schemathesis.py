"""Schema-driven fuzzing of a live tiny-model server (issue 13): schemathesis, bounded to ~60 s,
finds no 5xx; and the OpenAPI schema it fuzzes from is complete (error responses documented in
OpenAI's shape, numeric ranges declared), so a fuzzer reaches generation instead of stopping at
validation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

ROOT = Path(__file__).resolve().parent.parent
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    """max_model_len=128 keeps each generated request short (the fuzzer leaves max_tokens open);
    the files and batches it creates stay in a temporary state dir."""
    state_dir = tmp_path_factory.mktemp("state")
    app, _ = app_from_config(
        compose_config(["model=tiny", "engine.max_model_len=128", f"server.state_dir={state_dir}"]), "tiny"
    )
    with BackgroundServer(app) as s:
        yield s


def test_schemathesis_finds_no_server_error(server: BackgroundServer, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    cmd = [
        *(sys.executable, "-m", "schemathesis.cli", "run", f"{server.url}/openapi.json"),
        *("--checks", "not_a_server_error", "--max-examples", "40", "--max-time", "50", "--seed", "0"),
        *("--workers", "1", "--request-timeout", "20", "--generation-database", "none", "--no-color"),
        *("--report", "junit", "--report-junit-path", str(junit)),
    ]
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": pythonpath}
    # run in tmp_path: schemathesis keeps a crash cache in ./.schemathesis
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    cases = ET.parse(junit).getroot().iter("testcase")
    assert len(list(cases)) >= 7, proc.stdout[-3000:]  # every operation was fuzzed
    finished = re.findall(
        r"^forge:request_success_total\{[^}]*\} (\S+)$", httpx.get(server.url + "/metrics").text, re.M
    )
    assert sum(float(x) for x in finished) > 0, "no fuzzed request reached generation"
    assert httpx.get(server.url + "/health").status_code == 200


def numeric_bounds(schema: dict[str, Any], components: dict[str, Any]) -> set[str]:
    """The bound keywords (minimum, maximum, exclusive...) anywhere in a property's schema."""
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[-1]]
    found: set[str] = {k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in schema}
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            found |= numeric_bounds(sub, components)
    return found


def request_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    components: dict[str, Any] = spec["components"]["schemas"]
    return components[body["$ref"].rsplit("/", 1)[-1]] if "$ref" in body else body


@pytest.mark.parametrize("path", GENERATION_ROUTES)
def test_the_schema_declares_ranges_and_error_responses(server: BackgroundServer, path: str) -> None:
    """Item 9: numeric fields declare their ranges; the 400 is documented, in OpenAI's shape."""
    spec = httpx.get(server.url + "/openapi.json").json()
    components = spec["components"]["schemas"]
    properties = request_schema(spec, path)["properties"]
    for field in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        assert {"minimum", "exclusiveMinimum"} & numeric_bounds(properties[field], components), (
            field,
            properties[field],
        )
        assert {"maximum", "exclusiveMaximum"} & numeric_bounds(properties[field], components), (
            field,
            properties[field],
        )
    responses = spec["paths"][path]["post"]["responses"]
    documented = next((responses[s] for s in ("400", "4XX", "default") if s in responses), None)
    assert documented is not None, sorted(responses)
    error = documented["content"]["application/json"]["schema"]
    error = components[error["$ref"].rsplit("/", 1)[-1]] if "$ref" in error else error
    assert "error" in error["properties"], error
