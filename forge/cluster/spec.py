"""What ``conf/cluster/*.yaml`` describes: how many replicas, and what differs between them.

A replica's config is the run's config with its own overrides merged on top (``overrides``: a list,
one mapping per replica, e.g. ``{engine: {max_num_seqs: 32}}``) and, when ``hardware`` lists presets,
its ``clock.hardware`` set to its entry: two A100 and two H100 replicas are
``cluster.replicas=4 cluster.hardware=[a100,a100,h100,h100]``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PoolSpec:
    """One pool of identical-role replicas: ``name`` (``replicas``, or ``prefill`` / ``decode``),
    and per replica its ``clock.hardware`` (None: the run's) and the overrides merged onto its config."""

    name: str
    hardware: tuple[str | None, ...]
    overrides: tuple[Mapping[str, Any], ...]

    @property
    def size(self) -> int:
        return len(self.hardware)


def pool(name: str, size: int, hardware: Sequence[str] | None, overrides: Sequence[Any] | None, key: str) -> PoolSpec:
    """A pool of ``size`` replicas; ValueError (naming ``cluster.<key>``) for a size below 1 or a
    per-replica list whose length is not ``size``."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"cluster.{key} must be an integer >= 1, got {size!r}")
    hw = list(hardware) if hardware is not None else [None] * size
    found = list(overrides) if overrides else [{}] * size
    for what, values in (("hardware", hw), ("overrides", found)):
        if len(values) != size:
            raise ValueError(f"cluster.{_prefixed(key, what)} lists {len(values)} entries for {size} replicas")
    for i, o in enumerate(found):
        if not isinstance(o, Mapping):
            raise ValueError(f"cluster.{_prefixed(key, 'overrides')}[{i}] must be a mapping, got {o!r}")
    return PoolSpec(name, tuple(hw), tuple(dict(o) for o in found))


def _prefixed(key: str, what: str) -> str:
    """``hardware`` for the ``replicas`` key, ``prefill_hardware`` for ``prefill_replicas``."""
    return what if key == "replicas" else f"{key.removesuffix('_replicas')}_{what}"


class ClusterSpec:
    """``replicas`` engines behind the run's ``router`` (``conf/cluster/default.yaml``; one replica:
    the engine alone). ``hardware``: a ``clock.hardware`` preset per replica (null: the clock's for
    all); ``overrides``: a mapping per replica merged onto its config (empty: none)."""

    disaggregated = False

    def __init__(self, replicas: int = 1, hardware: list[str] | None = None, overrides: list[Any] | None = None):
        self.replicas = pool("replicas", replicas, hardware, overrides, "replicas")

    def pools(self) -> list[PoolSpec]:
        return [self.replicas]
