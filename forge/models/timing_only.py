"""The synthetic model's timing-only mode (``model.timing_only=true``): prompts as lengths, no tokens computed.

Under a simulated clock nothing that a run records (``requests.parquet``, ``steps.parquet``,
``summary.json``) reads a token id when every request runs to its ``max_tokens``: the scheduler, the
KV cache without prefix caching, the clock and the metrics read lengths only. The mode then keeps
one shared prompt list per distinct length instead of a list of random ids per request
(``LengthsTokenizer``) and the model samples a constant token without touching its cache, so a run
takes the memory of its lengths, not of its prompts. ``check_timing_only`` refuses, as one-line
config errors, the settings under which an id could change a length or a time (a prefix cache's
hashes, a drafter's acceptance, stop tokens or strings, EOS, structured output) or the clock is real."""

from __future__ import annotations

import random
from collections.abc import Sequence

from omegaconf import DictConfig

from forge.tokenizers.base import ByteTokenizer

FILL = 32  # the token every prompt position holds in timing-only mode (a space)


class LengthsTokenizer(ByteTokenizer):
    """A ``ByteTokenizer`` whose random prompts are lengths: ``random_token_id_lists`` returns one
    shared list of ``FILL`` per distinct length (never to be mutated: nothing in forge writes to a
    prompt) and draws nothing from the generator; the forge workloads that call it pass a generator
    of their own for prompt tokens (``SyntheticWorkload``, the Vidur workloads), so their arrivals,
    lengths and priorities are those of the id path. ``random_token_ids`` (one prompt, or a part of
    one, from a generator a workload may draw other things from) draws as ``ByteTokenizer`` does, so
    the generator's state is the same, and returns the shared list of that length."""

    def __init__(self, vocab_size: int = 320) -> None:
        super().__init__(vocab_size)
        self._shared: dict[int, list[int]] = {}

    def _of_length(self, n: int) -> list[int]:
        found = self._shared.get(n)
        if found is None:
            found = self._shared[n] = [FILL] * n
        return found

    def random_token_ids(self, n: int, rng: random.Random) -> list[int]:
        super().random_token_ids(n, rng)  # the generator advanced as on the id path
        return self._of_length(n)

    def random_token_id_lists(self, lengths: Sequence[int], rng: random.Random) -> list[list[int]]:
        of_length = self._of_length
        return [of_length(n) for n in lengths]


def _is_set(node: DictConfig | None, key: str) -> bool:
    value = node.get(key) if node is not None else None
    return bool(value)


def timing_only_problem(cfg: DictConfig) -> str | None:
    """Why ``model.timing_only=true`` cannot hold for ``cfg`` (None: it holds, or the mode is off)."""
    model = cfg.get("model")
    if model is None or not model.get("timing_only", False):
        return None
    clock = str(cfg.clock.get("_target_", "")) if cfg.get("clock") is not None else ""
    sampling = cfg.get("sampling")
    workload = cfg.get("workload")
    checks = (
        (clock.rsplit(".", 1)[-1] not in ("SimulatedClock", "ProfiledClock"), "needs clock=simulated (or profiled)"),
        (_is_set(cfg.get("kvcache"), "enable_prefix_caching"), "needs kvcache.enable_prefix_caching=false (hashes)"),
        (cfg.get("drafter") is not None, "needs no drafter (acceptance reads the tokens)"),
        (_is_set(sampling, "stop") or _is_set(sampling, "stop_token_ids"), "needs no sampling.stop/stop_token_ids"),
        (_is_set(sampling, "json_schema") or _is_set(sampling, "regex"), "needs no structured output"),
        (
            not (_is_set(workload, "ignore_eos") or _is_set(sampling, "ignore_eos")),
            "needs workload.ignore_eos=true (every request runs to its max_tokens)",
        ),
    )
    for failed, why in checks:
        if failed:
            return f"model.timing_only=true {why}"
    return None
