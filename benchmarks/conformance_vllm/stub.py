"""Stand-ins for ``vllm`` (which forge does not install): ``import vllm.x`` and ``from vllm.x import Y``
succeed, so a test module that only imports vLLM's code still runs; a test that *calls* vLLM's own
Python code (builds a protocol model, a tokenizer, a serving object) fails with ``VllmInternalUsed``
naming what it called: that test exercises vLLM's in-process API, not the HTTP server. One exception,
``AdapterDownloads``: LoRA adapter downloads give empty directories, so a module whose server fixture
fetches adapters still starts forge and runs its base-model tests.

While a module is imported (collection), a call returns another stand-in (falsy), so decorators
such as ``skipif(current_platform.is_rocm(), ...)`` evaluate instead of failing the whole file."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

MARK = "VllmInternalUsed"


class VllmInternalUsed(RuntimeError):
    """A test called vLLM's own Python code, which is not the server under test."""


class Switch:
    """Whether calls fail (during a test) or return stand-ins (while modules are imported)."""

    def __init__(self) -> None:
        self.strict = False


class _Meta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return stand_in(f"{cls.__qualname__}.{name}", cls._switch)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls._switch.strict:
            raise VllmInternalUsed(f"{MARK}: the test calls vLLM's own {cls.__qualname__}")
        return stand_in(f"{cls.__qualname__}()", cls._switch)

    def __bool__(cls) -> bool:
        return False

    def __getitem__(cls, key: Any) -> Any:
        return stand_in(f"{cls.__qualname__}[]", cls._switch)

    def __iter__(cls) -> Iterator[Any]:
        return iter(())

    def __or__(cls, other: Any) -> Any:
        return Any  # an annotation such as ``VllmThing | None``

    def __ror__(cls, other: Any) -> Any:
        return Any


def stand_in(name: str, switch: Switch) -> type:
    """A class named ``name`` (vLLM's dotted path) standing in for whatever vLLM defines there."""
    return _Meta(name, (), {"_switch": switch, "__qualname__": name, "__module__": "vllm"})


class AdapterDownloads:
    """Stands in for vLLM's ``hf_api()``, with which a test module fetches LoRA adapters to start its
    server with ``--lora-modules`` (forge serves no LoRA; the flag is dropped): an empty directory per
    repository, so that the module's tests of the base model still run against forge."""

    def snapshot_download(self, repo_id: str, **_: Any) -> str:
        path = Path(tempfile.gettempdir()) / "forge-vllm-suite-adapters" / repo_id
        path.mkdir(parents=True, exist_ok=True)
        return str(path)


STANDS_IN = {"vllm.transformers_utils.repo_utils.hf_api": AdapterDownloads}


class StubModule(ModuleType):
    def __init__(self, name: str, switch: Switch) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self._switch = switch

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        return STANDS_IN.get(full) or stand_in(full, self._switch)


class VllmFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``vllm`` and every ``vllm.*`` module as a ``StubModule``."""

    def __init__(self, switch: Switch) -> None:
        self.switch = switch

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname == "vllm" or fullname.startswith("vllm."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return StubModule(spec.name, self.switch)

    def exec_module(self, module: ModuleType) -> None:
        return None


def install(switch: Switch) -> VllmFinder:
    finder = VllmFinder(switch)
    sys.meta_path.insert(0, finder)
    return finder
