"""Schemathesis hooks for ``test_server_schemathesis.py`` (loaded with ``SCHEMATHESIS_HOOKS``).

The fuzzer is told the served model's name, as a client would know it: every body schema with a
``model`` property gets ``const: tiny``, so generated requests reach validation and the engine
instead of stopping at 404 (unknown model)."""

from __future__ import annotations

from typing import Any

import schemathesis

SERVED_MODEL = "tiny"


@schemathesis.hook
def before_load_schema(context: schemathesis.HookContext, raw_schema: dict[str, Any]) -> None:
    for schema in raw_schema.get("components", {}).get("schemas", {}).values():
        properties = schema.get("properties", {})
        if "model" in properties and "model" in schema.get("required", []):
            properties["model"] = {"type": "string", "const": SERVED_MODEL}
