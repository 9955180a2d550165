"""Offline batch runs: ``python -m forge.batch INPUT.jsonl OUTPUT.jsonl [overrides ...]``.

vLLM's ``run-batch`` convention: each input line is an OpenAI Batch API request
(``{"custom_id", "method": "POST", "url", "body"}``, url ``/v1/completions`` or
``/v1/chat/completions``), each output line ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}`` in input order, failures included (a line that cannot be read
has ``"response": null`` and an ``error`` naming its line number). The extra arguments are Hydra
overrides as for ``forge run`` (``model=smollm2 engine.max_num_seqs=16``); the body's ``model``
is the model option's name. No HTTP server: each line runs through the served routes' own
functions on the engine, so a body gets the answer ``/v1/...`` would give it.

Exit status: 0 when every line was run (whatever each line's status), 2 on a config error or an
input file that cannot be read (one line on stderr; ``FORGE_FULL_ERROR=1`` shows a config error's
traceback)."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from forge.cli import hydra_error_line
from forge.config import CONF_DIR, ConfigError, register_schema
from forge.core.errors import INPUT_EXIT_CODE, full_errors_wanted
from forge.server.app import app_from_config
from forge.server.batch_lines import BatchLine, Handler, error_record, is_success, read_lines, run_line

USAGE = "usage: python -m forge.batch INPUT.jsonl OUTPUT.jsonl [hydra overrides ...]"


def batch_config(overrides: Sequence[str]) -> tuple[DictConfig, str]:
    """The composed config and the served model's name (the model option's, ``tiny``)."""
    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    name = str(cfg.hydra.runtime.choices.get("model") or "forge")
    del cfg.hydra
    return cfg, name


async def run_requests(handlers: dict[str, Handler], text: str, concurrency: int) -> list[dict[str, Any]]:
    """The output record of every line of ``text``, in order; at most ``concurrency`` run at once."""
    items = read_lines(text, None, handlers)
    gate = asyncio.Semaphore(concurrency)

    async def one(item: BatchLine) -> dict[str, Any]:
        async with gate:
            return await run_line(handlers, item)

    return list(
        await asyncio.gather(*(one(i) if isinstance(i, BatchLine) else _record(error_record(i)) for i in items))
    )


async def _record(record: dict[str, Any]) -> dict[str, Any]:
    return record


async def run_file(cfg: DictConfig, model_name: str, text: str) -> list[dict[str, Any]]:
    app, _ = app_from_config(cfg, model_name)
    state = app.state.forge
    concurrency = max(1, min(state.settings.max_waiting, 2 * int(cfg.engine.max_num_seqs)))
    async with app.router.lifespan_context(app):
        return await run_requests(state.handlers, text, concurrency)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0].startswith("-") or args[1].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    source, target, overrides = Path(args[0]), Path(args[1]), args[2:]
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"forge.batch: cannot read {source}: {exc}", file=sys.stderr)
        return INPUT_EXIT_CODE
    try:
        cfg, name = batch_config(overrides)
        with tempfile.TemporaryDirectory(prefix="forge-batch-") as state_dir:
            cfg.server.state_dir = state_dir  # the server's /v1/batches store stays out of an offline run
            records = asyncio.run(run_file(cfg, name, text))
    except (ConfigError, HydraException, OmegaConfBaseException) as exc:
        if full_errors_wanted():
            raise
        print(f"config error: {exc if isinstance(exc, ConfigError) else hydra_error_line(exc)}", file=sys.stderr)
        return INPUT_EXIT_CODE
    target.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    ok = sum(1 for r in records if is_success(r))
    print(f"{len(records)} requests: {ok} succeeded, {len(records) - ok} failed -> {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
