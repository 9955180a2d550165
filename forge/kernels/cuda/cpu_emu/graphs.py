"""CUDA-graph semantics for the CPU layer, behind the ``torch.cuda`` names ``GraphRunner`` uses.

``CpuGraphs().graph(g)`` captures: every torch op run inside it (through a
``TorchDispatchMode``) and every kernel launch of the CPU layer is recorded in ``g`` in
order, and ``g.replay()`` re-runs exactly those ops on the same tensors: no Python code of
the captured function runs again, so a decision it made on the host (a branch, a Python
scalar, a grid size) is frozen at capture, as on a GPU. Ops that create tensors are re-run
and their results copied into the tensors made at capture (the graph's memory pool), which
stay alive with the graph. Views are not recorded (they alias memory that replay updates).

As on a GPU, where capture only records work, every floating-point tensor created during
capture is filled with NaN when the capture ends: reading a captured output before a replay
returns garbage. Unlike a GPU, the ops also run during capture (in-place writes to
pre-existing tensors included). A host read of device data during capture raises
``HostReadDuringCapture``: ``.item()``, ``.tolist()``, ``.numpy()``, ``.cpu()``, truth
values and ``int()``/``float()`` of a tensor, ``torch.equal``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

HOST_READ_METHODS = frozenset(
    {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.cpu,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__index__,
        torch.Tensor.__array__,
    }
)
HOST_READ_OPS = frozenset(
    {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.equal.default, torch.ops.aten.is_nonzero.default}
)


class HostReadDuringCapture(RuntimeError):
    """Device data was read on the host while a graph was being captured (a GPU would fail the capture)."""


class CpuGraph:
    """``torch.cuda.CUDAGraph`` for the CPU layer: a recorded list of ops, re-run by ``replay``."""

    def __init__(self) -> None:
        self.ops: list[Callable[[], None]] = []
        self.captured = False
        self.replays = 0

    def replay(self) -> None:
        if not self.captured:
            raise RuntimeError("replay of a graph that was never captured")
        for op in self.ops:
            op()
        self.replays += 1


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


class _RecordOps(TorchDispatchMode):
    def __init__(self, graph: CpuGraph, created: list[torch.Tensor]) -> None:
        super().__init__()
        self.graph = graph
        self.created = created

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in HOST_READ_OPS:
            raise HostReadDuringCapture(f"{func} reads device data on the host during graph capture")
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
        outputs = _tensors(out)
        # A view op whose results alias its inputs is not recorded. Under inference mode torch hands
        # the mode composite ops marked as views (aten.reshape, aten.to) that may copy: such a copy
        # is recorded like any created tensor (else replays read memory capture no longer holds).
        if func.is_view and all(t.untyped_storage().data_ptr() in inputs for t in outputs):
            return out
        if func._schema.is_mutable:
            self.graph.ops.append(lambda: func(*args, **kwargs))
            return out
        if outputs:
            self.created.extend(t for t in outputs if t.untyped_storage().data_ptr() not in inputs)
            self.graph.ops.append(lambda: _copy_into(outputs, _tensors(func(*args, **kwargs))))
        return out


def _copy_into(targets: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    for target, value in zip(targets, values, strict=True):
        target.copy_(value)


class _ForbidHostReads(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func in HOST_READ_METHODS:
            raise HostReadDuringCapture(f"{func.__name__} reads device data on the host during graph capture")
        return func(*args, **(kwargs or {}))


class _Stream:
    """``torch.cuda.Stream``: CPU work is synchronous, so ordering needs nothing."""

    cuda_stream = 0

    def wait_stream(self, other: _Stream) -> None:
        return None

    def synchronize(self) -> None:
        return None


class CpuGraphs:
    """The ``torch.cuda`` functions ``forge.kernels.cuda_graphs.GraphRunner`` calls, for the CPU layer."""

    CUDAGraph = CpuGraph
    Stream = _Stream

    def __init__(self) -> None:
        self._capturing: CpuGraph | None = None
        self.captured: list[CpuGraph] = []  # every graph captured through this API, in order

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def graph_pool_handle() -> object:
        return object()

    @staticmethod
    def current_stream(device: Any = None) -> _Stream:
        return _Stream()

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    @contextmanager
    def stream(stream: _Stream) -> Iterator[None]:
        yield

    @property
    def capturing(self) -> bool:
        return self._capturing is not None

    def record_launch(self, launch: Callable[[], None]) -> None:
        """Called by every kernel launch of the layer: recorded when a capture is under way."""
        if self._capturing is not None:
            self._capturing.ops.append(launch)

    @contextmanager
    def graph(self, graph: CpuGraph, pool: object = None, capture_error_mode: str = "global") -> Iterator[CpuGraph]:
        if self._capturing is not None:
            raise RuntimeError("a graph capture is already under way")
        if graph.captured:
            raise RuntimeError("this graph was already captured")
        created: list[torch.Tensor] = []
        self._capturing = graph
        try:
            with _ForbidHostReads(), _RecordOps(graph, created):
                yield graph
        finally:
            self._capturing = None
        graph.captured = True
        self.captured.append(graph)
        for t in created:  # a GPU computes nothing during capture
            if t.is_floating_point():
                t.fill_(float("nan"))
