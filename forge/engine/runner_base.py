"""The runner contract: what the engine asks of whatever computes its steps."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from forge.core.decode_run import DecodeRun
from forge.core.outputs import ModelOutput, SchedulerOutput
from forge.kernels.base import KernelBackend
from forge.models.base import HiddenStateModel, Model


class Runner(ABC):
    """Computes the engine's steps on a model and owns the KV memory they read and write.

    - ``model``: the model it runs (the engine reads its tokenizer and dimensions); ``backend``: the
      kernel backend it runs on.
    - ``hidden_model``: the same model where it also gives hidden states (embeddings), else None.
    - ``execute(sched)``: one scheduled step (``SchedulerOutput``: its rows, their requests and the
      KV copies to do first) computed and sampled; per request its tokens, or its failure in
      ``ModelOutput.failed``. An exception fails the whole step's requests (``EngineDeadError``: the
      engine cannot go on).
    - ``close()``: release what it holds outside this process; idempotent.

    What ``execute`` owes each row of ``sched.scheduled`` (its request is the same position of
    ``sched.requests``): a row with ``sample`` set gets ``ModelOutput.sampled_token_ids[request_id]``,
    the token sampled after its last position (``request.sampling_params`` says how), or after a row
    with ``num_draft_tokens`` drafts the accepted drafts plus one token; ``logprobs`` and
    ``prompt_logprobs`` where the request asks for them, ``pooled`` for an embedding request (only
    with a ``hidden_model``). Before the forward, a runner that holds KV memory does the block copies
    (``swap_out``, ``copy_blocks``, ``swap_in``) and writes each row's KV through its ``block_table``.

    Built by ``forge.engine.build.build_runner`` for the model, or, with the ``runner`` config group
    (``runner=<name>``: ``conf/runner/<name>.yaml`` or one on ``hydra.searchpath``), its ``_target_``
    called with the YAML's fields and the keywords ``model``, ``backend``, ``num_blocks``,
    ``block_size``, ``seed``, ``num_cpu_blocks``, ``max_num_seqs``, ``max_model_len``, ``kv_spec`` and
    ``kv_groups`` (the pool the KV cache manager hands out; ``docs/extending.md``).

    Optional capabilities, declared (the defaults say "not supported"; the engine never probes the
    runner's type):

    - ``decode_runs``: whether ``execute_decode_run(run)`` computes a ``DecodeRun`` (consecutive plain
      greedy decode steps) at once: each row's ``num_steps`` tokens, the KV written as the steps would.
    - ``fast_path_components()``: the components whose own ``fast_paths`` declarations its fast paths
      rely on (``forge.core.fast_paths``), by name, so the engine can say which run plain.
    """

    model: Model
    backend: KernelBackend
    hidden_model: HiddenStateModel | None = None

    @abstractmethod
    def execute(self, sched: SchedulerOutput) -> ModelOutput: ...

    @property
    def decode_runs(self) -> bool:
        return False

    def execute_decode_run(self, run: DecodeRun) -> list[list[int]]:
        raise NotImplementedError(f"{type(self).__name__} computes no decode runs (decode_runs is False)")

    def fast_path_components(self) -> Mapping[str, object]:
        return {}

    def close(self) -> None:
        """Release what the runner holds outside this process (nothing, by default)."""
