"""Chat templates: the Jinja2 template a model file ships, rendered the way Hugging Face does.

Same environment as ``transformers`` (sandboxed, ``trim_blocks``/``lstrip_blocks``, loop
controls, ``tojson``, ``raise_exception``, ``strftime_now``), so a template written for HF
renders identically here.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template raised (``raise_exception``) or failed to render."""


# what a template's own expressions raise over a request's values (``bos_token + '...'`` on a model
# without a BOS token, a division by the number of messages, ...): the request's error, as in vLLM
RENDER_ERRORS = (TypeError, ValueError, LookupError, ArithmeticError, AttributeError)


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compiled template (cached per source text: compiling costs milliseconds)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


@lru_cache(maxsize=16)
def template_variables(source: str) -> frozenset[str]:
    """The variables the template reads from its context (Jinja2's ``find_undeclared_variables``: every
    name it uses without setting it, wherever it is, even in a branch a render may not take)."""
    env = compile_template(source).environment
    return frozenset(meta.find_undeclared_variables(env.parse(source)))


def render_chat(
    source: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    special_tokens: dict[str, str | None] | None = None,
    **extra: Any,
) -> str:
    """``source`` rendered over ``messages``; ``special_tokens`` supplies ``bos_token``, ``eos_token``...

    The result already holds the template's special tokens: encode it with
    ``add_special_tokens=False`` to avoid a second BOS.
    """
    template = compile_template(source)
    try:
        return template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **(special_tokens or {}), **extra
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed to render: {exc}") from exc
    except RENDER_ERRORS as exc:
        raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc
