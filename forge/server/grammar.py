"""A request's grammar: which of its structured-output fields asks for one (at most one may), compiled
off the event loop within the structured compile budget."""

from __future__ import annotations

from forge.server.guided import guided_specs
from forge.server.protocol import APIError, SamplingFields
from forge.structured.base import ConstraintSpec, Grammar, GrammarError
from forge.structured.compile_pool import CompileBusy, CompilePool

ONE_FIELD = (
    "give at most one structured-output field (response_format, json_schema, regex, guided_json, "
    "guided_regex, guided_choice, structured_outputs)"
)


def _response_format_specs(body: SamplingFields) -> list[tuple[str, ConstraintSpec]]:
    rf = body.response_format
    if rf is None or rf.type == "text":
        return []
    if rf.type == "json_object":
        spec = ConstraintSpec.json_object() if rf.schema_ is None else ConstraintSpec.json_schema(rf.schema_)
        return [("response_format", spec)]
    if rf.json_schema is None or rf.json_schema.schema_ is None:
        raise APIError("response_format json_schema needs json_schema.schema", param="response_format")
    return [("response_format", ConstraintSpec.json_schema(rf.json_schema.schema_))]


def structured_specs(body: SamplingFields, tool_spec: ConstraintSpec | None) -> list[tuple[str, ConstraintSpec]]:
    """Every constraint the body asks for, each with the field that asks (``tool_spec``: the one
    ``tool_choice`` required/named imposes)."""
    specs: list[tuple[str, ConstraintSpec]] = [] if tool_spec is None else [("tool_choice", tool_spec)]
    specs += _response_format_specs(body)
    if body.json_schema is not None:
        specs.append(("json_schema", ConstraintSpec.json_schema(body.json_schema)))
    if body.regex is not None:
        specs.append(("regex", ConstraintSpec.regex(body.regex)))
    specs.extend(guided_specs(body))
    return specs


async def request_grammar(
    body: SamplingFields, tool_spec: ConstraintSpec | None, pool: CompilePool | None
) -> Grammar | None:
    """The request's grammar (None: unconstrained); 400 for two constraints, one this server cannot
    compile or one that does not compile, 503 when the compile pool is busy."""
    specs = structured_specs(body, tool_spec)
    if not specs:
        return None
    if len(specs) > 1:
        raise APIError(ONE_FIELD, param=specs[1][0])
    param, spec = specs[0]
    if pool is None:
        raise APIError("structured output is not configured on this server", param=param)
    try:
        return await pool.compile(spec)
    except GrammarError as exc:
        raise APIError(str(exc), param=param) from exc
    except CompileBusy as exc:
        raise APIError(str(exc), 503, "service_unavailable", param=param, code="overloaded") from exc
