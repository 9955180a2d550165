"""What ``conf/cluster/*.yaml`` describes: how many replicas, and what differs between them.

A replica's config is the run's config with its own overrides merged on top (``overrides``: a list,
one mapping per replica, e.g. ``{engine: {max_num_seqs: 32}}``) and, when ``hardware`` lists presets,
its ``clock.hardware`` set to its entry: two A100 and two H100 replicas are
``cluster.replicas=4 cluster.hardware=[a100,a100,h100,h100]``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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


LINKS_DIR = Path(__file__).resolve().parent.parent.parent / "conf" / "hardware" / "links"


@dataclass(frozen=True)
class Link:
    """The interconnect a prompt's KV crosses from a prefill to a decode replica: ``bandwidth`` in
    bytes/s (one direction), ``latency`` in seconds per transfer."""

    name: str
    bandwidth: float
    latency: float

    def transfer_time(self, num_bytes: float, num_layers: int = 1, overlap_s: float = 0.0) -> float:
        """Seconds a transfer of ``num_bytes`` adds after the prefill: latency + bytes / bandwidth; with
        layer-wise overlap (``num_layers`` > 1), each layer's KV is sent while the later layers compute
        (``overlap_s``: the prefill's compute time), so at least the last layer's share is exposed."""
        whole = num_bytes / self.bandwidth
        if num_layers <= 1:
            return self.latency + whole
        hidden = overlap_s * (num_layers - 1) / num_layers
        return self.latency + max(whole / num_layers, whole - hidden)


def link_preset(name: str, bandwidth_gbps: float | None = None, latency_s: float | None = None) -> Link:
    """``conf/hardware/links/<name>.yaml``, its bandwidth (GB/s) or latency replaced where given;
    ValueError for an unknown preset, a bandwidth <= 0 or a negative latency."""
    import yaml

    path = LINKS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in LINKS_DIR.glob("*.yaml"))
        raise ValueError(f"cluster.link={name!r}: not an interconnect preset (known: {', '.join(known)})")
    preset = yaml.safe_load(path.read_text())
    gbps = preset["bandwidth_gbps"] if bandwidth_gbps is None else bandwidth_gbps
    latency = preset["latency_s"] if latency_s is None else latency_s
    if not (isinstance(gbps, int | float) and math.isfinite(gbps) and gbps > 0):
        raise ValueError(f"cluster.link_bandwidth_gbps must be a finite number > 0, got {gbps!r}")
    if not (isinstance(latency, int | float) and math.isfinite(latency) and latency >= 0):
        raise ValueError(f"cluster.link_latency_s must be a finite number >= 0, got {latency!r}")
    return Link(name, float(gbps) * 1e9, float(latency))


class DisaggregatedSpec:
    """Prefill and decode on separate replicas (``conf/cluster/disaggregated.yaml``): ``prefill_replicas``
    compute each prompt and its first token, behind the run's ``router``; the prompt's KV then crosses
    ``link`` (a preset of ``conf/hardware/links``, its numbers replaced by ``link_bandwidth_gbps`` /
    ``link_latency_s`` where set) to one of ``decode_replicas``, chosen by ``decode_router``, which
    generates the rest. ``layerwise_overlap``: the KV streams layer by layer while the prefill computes.
    ``*_hardware`` / ``*_overrides``: per replica of each pool, as ``ClusterSpec``'s."""

    disaggregated = True

    def __init__(
        self,
        prefill_replicas: int = 1,
        decode_replicas: int = 1,
        prefill_hardware: list[str] | None = None,
        decode_hardware: list[str] | None = None,
        prefill_overrides: list[Any] | None = None,
        decode_overrides: list[Any] | None = None,
        link: str = "nvlink",
        link_bandwidth_gbps: float | None = None,
        link_latency_s: float | None = None,
        layerwise_overlap: bool = False,
        decode_router: Any = None,
    ):
        self.prefill = pool("prefill", prefill_replicas, prefill_hardware, prefill_overrides, "prefill_replicas")
        self.decode = pool("decode", decode_replicas, decode_hardware, decode_overrides, "decode_replicas")
        self.link = link_preset(link, link_bandwidth_gbps, link_latency_s)
        self.layerwise_overlap = layerwise_overlap
        self.decode_router = decode_router

    def pools(self) -> list[PoolSpec]:
        return [self.prefill, self.decode]
