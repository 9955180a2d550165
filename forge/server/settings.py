"""Settings of the HTTP front end (the ``server`` conf group)."""

from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from forge.server.json_nesting import MAX_JSON_NESTING, MAX_JSON_NESTING_CEILING

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's
# forge.server.tools.PARSERS' names, here so that checking a setting imports no pydantic (tested equal)
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral")


@dataclass
class ServerSettings:
    """``api_keys``: accepted bearer keys (plus ``$FORGE_API_KEY``); none set: no auth.
    ``admin_key``: the bearer key ``POST /shutdown`` needs (plus ``$FORGE_ADMIN_KEY``; either is
    accepted); none set: nobody can stop the server over HTTP. An API key is not an admin key.
    ``rate_limit_rps`` / ``rate_limit_burst``: per-key token bucket over requests (0: off).
    ``max_waiting``: requests queued for the engine before new ones get 503.
    ``max_n``: most choices per request (n x prompts). ``shutdown_timeout_s``: how long in-flight
    requests may finish on shutdown (SIGTERM) before they are aborted (streams then get a final
    ``finish_reason="abort"`` chunk and ``[DONE]``).
    ``served_model_name``: the id ``/v1/models`` lists (null: the model option's name).
    ``max_stop_len``: most characters in one stop string.
    ``max_output_units``: most output units one completions, chat or embeddings request may produce, checked
    before it runs (``forge.server.budget``: per choice ``max_tokens x (1 + logprob entries)``, plus echoed
    and prompt-logprob prompt tokens; embeddings: inputs x dimensions); past it, a 400.
    ``max_body_bytes``: larger request bodies get 413. ``body_timeout_s``: a body not complete
    this long after its headers gets 408. ``header_timeout_s``: a connection whose request
    headers are not complete this long after it opened (or after the request's first byte) is
    closed. ``keep_alive_timeout_s``: idle keep-alive connections are closed after this long.
    ``max_header_bytes``: a request head still incomplete after this many bytes is refused
    (uvicorn's ``h11_max_incomplete_event_size``). ``max_json_nesting``: JSON nested deeper (a body,
    or JSON text a body carries: ``guided_json``, tool-call ``arguments``) gets 400; at most
    ``forge.server.json_nesting.MAX_JSON_NESTING_CEILING``. ``trusted_proxies``: addresses (or
    networks, or ``*``) whose ``X-Forwarded-For`` / ``X-Forwarded-Proto`` are believed (uvicorn's
    ``forwarded_allow_ips``); empty: none, so a client cannot pick the address its rate limit is
    counted under.
    ``tool_call_parser``: how tool calls are read from the model's text (``hermes``,
    ``llama3_json`` or ``mistral``; ``forge.server.tools.PARSERS``), like vLLM's
    ``--tool-call-parser``; null: only ``tool_choice`` required/named calls are made.
    ``chat_template``: a Jinja2 chat template file used instead of the model's own (vLLM's
    ``--chat-template``); null: the model's.
    ``state_dir``: where ``/v1/files`` and ``/v1/batches`` keep their files and batch records
    (null: ``server-state`` in forge's cache, ``$FORGE_CACHE_DIR`` or ``~/.cache/forge``); a batch
    in progress when the server stops resumes when a server of the same model starts on it.
    ``batch_max_in_flight``: batch requests the batch runner keeps in the engine at once (the cap
    that keeps interactive latency bounded whatever the scheduler). ``batch_priority``: the
    ``priority`` batch requests carry at least (lower runs first under ``scheduler=priority``;
    interactive requests default to 0). ``batch_window_s``: a batch's completion window (``24h``, the only
    ``completion_window`` OpenAI accepts) in seconds; a batch still validating or in progress past it
    expires (status ``expired``: the requests that ended keep their results, the rest get
    ``batch_expired`` records in the error file). Shorter only for tests and demos.
    ``admin_api_keys``: API keys that see and act on every key's files and batches (each key of
    ``api_keys`` sees only its own); they are accepted wherever an API key is. Not the
    ``admin_key`` of ``POST /shutdown``."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: list[str] = field(default_factory=list)
    rate_limit_rps: float = 0.0
    rate_limit_burst: int = 0
    max_waiting: int = 4096
    max_n: int = 16
    max_logprobs: int = 20
    shutdown_timeout_s: float = 10.0
    served_model_name: str | None = None
    log_level: str = "info"
    max_stop_len: int = 1024
    max_output_units: int = 1024 * 1024
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    keep_alive_timeout_s: float = 5.0
    max_header_bytes: int = 16 * 1024
    max_json_nesting: int = MAX_JSON_NESTING
    trusted_proxies: list[str] = field(default_factory=list)
    tool_call_parser: str | None = "hermes"
    chat_template: str | None = None
    state_dir: str | None = None
    batch_max_in_flight: int = 4
    batch_priority: int = 1000
    batch_window_s: int = 24 * 3600
    admin_key: str | None = field(default=None, repr=False)
    admin_api_keys: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.api_keys = [str(k) for k in self.api_keys]
        self.admin_api_keys = [str(k) for k in self.admin_api_keys]
        if self.admin_key is not None:
            self.admin_key = str(self.admin_key)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"server.port must be in 0..65535, got {self.port}")
        if not (math.isfinite(self.rate_limit_rps) and self.rate_limit_rps >= 0) or self.rate_limit_burst < 0:
            raise ValueError(
                f"server.rate_limit_rps and server.rate_limit_burst must be finite and >= 0, "
                f"got {self.rate_limit_rps} and {self.rate_limit_burst}"
            )
        if self.max_logprobs < 0:
            raise ValueError(f"server.max_logprobs must be >= 0, got {self.max_logprobs}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"server.log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.max_waiting < 1 or self.max_n < 1:
            raise ValueError("server.max_waiting and server.max_n must be >= 1")
        if self.batch_max_in_flight < 1 or self.batch_window_s < 1:
            raise ValueError(
                f"server.batch_max_in_flight and server.batch_window_s must be >= 1, "
                f"got {self.batch_max_in_flight} and {self.batch_window_s}"
            )
        for name in ("max_stop_len", "max_output_units", "max_body_bytes", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"server.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("body_timeout_s", "header_timeout_s", "keep_alive_timeout_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"server.{name} must be a positive number of seconds, got {value}")
        self._check_nesting_and_proxies()
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"server.tool_call_parser must be one of {list(TOOL_CALL_PARSERS)} or null, got {self.tool_call_parser}"
            )
        if not 0 <= self.shutdown_timeout_s < float("inf"):
            raise ValueError(f"server.shutdown_timeout_s must be >= 0, got {self.shutdown_timeout_s}")

    def _check_nesting_and_proxies(self) -> None:
        if not 1 <= self.max_json_nesting <= MAX_JSON_NESTING_CEILING:
            raise ValueError(
                f"server.max_json_nesting must be in 1..{MAX_JSON_NESTING_CEILING}, got {self.max_json_nesting}"
            )
        self.trusted_proxies = [str(p) for p in self.trusted_proxies]
        if self.trusted_proxies == ["*"]:
            return
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy) if "/" in proxy else ipaddress.ip_address(proxy)
            except ValueError:
                raise ValueError(
                    f"server.trusted_proxies: {proxy[:64]!r} is not an IP address or network ('*' alone: any)"
                ) from None

    def state_path(self) -> Path:
        """The state directory (``state_dir``, or ``server-state`` in forge's cache)."""
        if self.state_dir is not None:
            return Path(self.state_dir).expanduser()
        from forge.core.cache import cache_dir

        return cache_dir() / "server-state"

    def chat_template_text(self) -> str | None:
        """``chat_template``'s file read and compiled (ValueError, at startup, when it does not compile)."""
        if self.chat_template is None:
            return None
        from forge.tokenizers.chat_template import compile_template

        text = Path(self.chat_template).expanduser().read_text(encoding="utf-8")
        compile_template(text)
        return text

    def keys(self) -> frozenset[str]:
        env = os.environ.get("FORGE_API_KEY")
        return frozenset([*self.api_keys, *self.admin_api_keys, *([env] if env else [])])

    def admin_api_key_set(self) -> frozenset[str]:
        """The keys that see every key's files and batches (``admin_api_keys``)."""
        return frozenset(self.admin_api_keys)

    def admin_keys(self) -> frozenset[str]:
        """The keys ``POST /shutdown`` accepts: ``admin_key`` and ``$FORGE_ADMIN_KEY`` (empty: none)."""
        env = os.environ.get("FORGE_ADMIN_KEY")
        return frozenset(k for k in (self.admin_key, env) if k)
