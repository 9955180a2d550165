"""YAML that forge reads from a user (``forge serve --config FILE``, ``FORGE_*`` values), read with bounds.

- the file: a regular file (a device, FIFO or directory is refused without reading it) of at most
  ``MAX_CONFIG_BYTES``, read with a bounded read, UTF-8;
- the text: checked on libyaml's event stream (iteratively, before any object is built) to nest at
  most ``MAX_DEPTH`` collections deep and to hold at most ``MAX_NODES`` values once every alias is
  expanded (an alias counts as the whole node it stands for, so a "billion laughs" of nested anchors
  is refused after reading a few lines); an alias inside its own anchor (a cycle) is refused;
- the mapping keys: a key given twice in one mapping is an error (PyYAML keeps the last one silently);
  ``<<`` merge keys still work, and a key written beside a merge still overrides the merged one;
- integers: at most 64 bits (no setting needs more; Python cannot read a decimal of 4,300 digits).

Every refusal is a ``ConfigError`` of one line that starts with the ``where`` it was given."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, ScalarEvent
from yaml.nodes import MappingNode, ScalarNode

from forge.config import ConfigError

# A serve config is a few hundred bytes. Every value then goes through Hydra's override parser, whose
# time grows faster than linearly with a list's length (a list of 2,000 keys: 0.2 s of CPU per parse,
# 20,000 keys: ~58 s for forge serve to start): these caps keep a config that passes them cheap.
MAX_CONFIG_BYTES = 256 << 10
MAX_DEPTH = 32  # collections inside collections (the deepest setting forge has is 4)
MAX_NODES = 1_000  # scalars and collections, aliases expanded
_MERGE_TAG = "tag:yaml.org,2002:merge"
_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """PyYAML's safe loader (libyaml's parser where installed) that refuses a key given twice."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the safe constructor refuses it below
                continue
            if repeated:
                raise ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        """An integer of at most 64 bits (Python refuses to read a decimal one of over 4,300 digits
        with a ``ValueError``, and would write a longer hexadecimal one back the same way)."""
        try:
            value = int(super().construct_yaml_int(node))
        except ValueError:
            value = 1 << 64
        if value.bit_length() > 64:
            raise ConstructorError(None, None, "an integer of more than 64 bits", node.start_mark)
        return value


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def read_config_text(path: Path, where: str, limit: int = MAX_CONFIG_BYTES) -> str:
    """The text of the regular file ``path``; at most ``limit`` + 1 bytes are ever read."""
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot open it ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{where}: not a regular file")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{where}: larger than {limit} bytes (a config file is at most that)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte {exc.start})") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A PyYAML error as one line: what is wrong and where."""
    if isinstance(exc, yaml.MarkedYAMLError):
        what = " ".join(part for part in (exc.context, exc.problem) if part) or type(exc).__name__
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return " ".join(what.split()) + where
    return type(exc).__name__


class _Sizes:
    """The event stream's depth and expanded size so far, and each finished anchor's size."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.open: list[tuple[str | None, int]] = [(None, 0)]  # (anchor, nodes so far) per open collection
        self.anchors: dict[str, int] = {}

    def add(self, nodes: int) -> None:
        anchor, count = self.open[-1]
        if count + nodes > MAX_NODES:
            raise ConfigError(f"{self.where}: holds more than {MAX_NODES} values once its aliases are expanded")
        self.open[-1] = (anchor, count + nodes)

    def start(self, anchor: str | None) -> None:
        if len(self.open) > MAX_DEPTH:
            raise ConfigError(f"{self.where}: nests deeper than {MAX_DEPTH} levels")
        self.open.append((anchor, 1))

    def end(self) -> None:
        anchor, count = self.open.pop()
        if anchor is not None:
            self.anchors[anchor] = count
        self.add(count)

    def alias(self, anchor: str) -> None:
        if any(name == anchor for name, _ in self.open):
            raise ConfigError(f"{self.where}: alias *{anchor} inside its own anchor (a cycle)")
        self.add(self.anchors.get(anchor, 1))  # an undefined alias is the loader's error


def _check_events(text: str, where: str) -> None:
    sizes = _Sizes(where)
    for event in yaml.parse(text, Loader=_BaseLoader):
        if isinstance(event, CollectionStartEvent):
            sizes.start(event.anchor)
        elif isinstance(event, CollectionEndEvent):
            sizes.end()
        elif isinstance(event, ScalarEvent):
            sizes.add(1)
            if event.anchor is not None:
                sizes.anchors[event.anchor] = 1
        elif isinstance(event, AliasEvent) and event.anchor is not None:
            sizes.alias(event.anchor)


def load_yaml_text(text: str, where: str) -> Any:
    """``text`` as YAML, within the limits above; a ``ConfigError`` naming ``where`` otherwise."""
    try:
        _check_events(text, where)
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):  # newer PyYAML (6.0.4) stops deep flow collections itself, first
            raise ConfigError(f"{where}: nests deeper than {MAX_DEPTH} levels") from None
        raise ConfigError(f"{where}: cannot read it as YAML: {_yaml_problem(exc)}") from None


def read_config_yaml(path: Path, where: str) -> Any:
    """The YAML file ``path`` read within the limits above."""
    return load_yaml_text(read_config_text(path, where), where)
