"""vLLM's structured-output request fields (``guided_json``, ``guided_regex``, ``guided_choice``
and the ``structured_outputs`` object) as forge ``ConstraintSpec``s."""

from __future__ import annotations

import json
from typing import Any

from forge.server.protocol import APIError, SamplingFields
from forge.structured.base import ConstraintSpec

_REGEX_SPECIAL = set("\\.^$*+?{}[]|()")


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of ``choices`` (``guided_choice``)."""
    escaped = ("".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in c) for c in choices)
    return "(" + "|".join(escaped) + ")"


def _json_spec(value: dict[str, Any] | bool | str, param: str) -> ConstraintSpec:
    """A JSON schema given as an object, a boolean, or JSON text (vLLM accepts all three)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise APIError(f"{param} is not valid JSON: {exc}", param=param) from exc
        if not isinstance(value, dict | bool):
            raise APIError(f"{param} must be a JSON schema (an object or a boolean)", param=param)
    return ConstraintSpec.json_schema(value)


def _choice_spec(choices: list[str], param: str) -> ConstraintSpec:
    if not choices or any(not c for c in choices):
        raise APIError(f"{param} needs at least one non-empty choice", param=param)
    return ConstraintSpec.regex(choice_regex(choices))


def guided_specs(body: SamplingFields) -> list[tuple[str, ConstraintSpec]]:
    """vLLM's guided_* fields and its ``structured_outputs`` object."""
    specs: list[tuple[str, ConstraintSpec]] = []
    if body.guided_json is not None:
        specs.append(("guided_json", _json_spec(body.guided_json, "guided_json")))
    if body.guided_regex is not None:
        specs.append(("guided_regex", ConstraintSpec.regex(body.guided_regex)))
    if body.guided_choice is not None:
        specs.append(("guided_choice", _choice_spec(body.guided_choice, "guided_choice")))
    so = body.structured_outputs
    if so is not None:
        given = [
            spec
            for spec in (
                None if so.json_ is None else _json_spec(so.json_, "structured_outputs"),
                None if so.regex is None else ConstraintSpec.regex(so.regex),
                None if so.choice is None else _choice_spec(so.choice, "structured_outputs"),
                ConstraintSpec.json_object() if so.json_object else None,
            )
            if spec is not None
        ]
        if len(given) != 1:
            raise APIError(
                "structured_outputs takes exactly one of json, regex, choice, json_object",
                param="structured_outputs",
            )
        specs.append(("structured_outputs", given[0]))
    return specs
