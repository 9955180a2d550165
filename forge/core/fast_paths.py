"""Fast paths, and the one rule that keeps them from changing an answer.

A fast path computes what the plain step loop would, with less work: a ``DecodeRun`` takes many
plain decode steps at once (``Engine.run`` under a simulated clock); ``KVCacheManager.decode_slot``
allocates a decode's slot without ``allocate_slots``' general bookkeeping; a cost model's
``step_time_of`` / ``decode_step_time`` sum a step's rows without building a ``BatchShape``; a
``HostModel`` computes a step on the host (``forward_host``, and ``forward_host_run`` for a run)
instead of ``forward``. Each of them skips hooks the plain loop calls (a policy's ``token_budget``
and ``running_order`` are called once for a whole run; ``allocate_slots``, ``usage``, ``step_time``
and ``forward`` are not called at all), so each is only right for a component whose skipped hooks
keep a promise (their base class's docstring says which).

The rule: **a component gets fast paths only if its own class says so** — ``fast_paths = True``
in the class body (``declares_fast_paths``). Nothing is inherited: a subclass of a shipped
policy, KV cache, clock, cost model or model gets the plain path until it declares the promise
itself, whatever it overrides. So a component written as the README shows, stateful hooks and
overridden methods included, gets exactly the plain loop's answer; declaring is the opt-in for
speed, after checking the promise (``tests/test_fast_paths.py`` compares on vs off).

Each fast path is an optional interface a declaring class implements, so the base contracts say
nothing of it: ``DecodeRunCache`` (``forge.kvcache.base``), ``DecodeRunClock`` (``forge.sim.clock``),
``FastCostModel`` (``forge.sim.cost_model``), ``HostModel`` / ``DecodeRunModel``
(``forge.engine.sim_runner``) and the runner's declared ``decode_runs`` (``forge.engine.runner_base``).

One more goes further: an event run (``forge.engine.event_runs``) computes a fresh engine's whole run
event by event (``forge.sim.event_replica``) when the run keeps no outputs, declared separately by
``event_runs = True`` in the own class body of the policy, the KV cache, the clock and the model.

``engine.fast_paths=false`` turns every fast path off for a run (the plain loop for every
component, declared or not): the check a researcher runs when in doubt."""

from __future__ import annotations

from collections.abc import Mapping

FAST_PATHS = "fast_paths"  # the class attribute a component's own class sets to True to declare


def declares_fast_paths(component: object) -> bool:
    """Whether ``component``'s own class (not a base class) declares ``fast_paths = True``."""
    return vars(type(component)).get(FAST_PATHS) is True


def plain_components(components: Mapping[str, object | None]) -> list[str]:
    """The names (e.g. ``scheduler: MyPolicy``) of the given components whose class does not declare
    fast paths, and so run the plain path; None entries (absent components) are skipped."""
    return [
        f"{name}: {type(c).__name__}" for name, c in components.items() if c is not None and not declares_fast_paths(c)
    ]
