"""Regex -> token-level DFA tables, without torch (this runs in the compile worker processes).

``spec_to_regex`` turns a spec into a regex (forge's JSON-schema compiler, ``schema_regex``);
``build_tables`` indexes the regex over a vocabulary with ``outlines_core.Index`` and returns
plain picklable tables: the token transitions (EOS left out) and, per state, the fewest tokens
to an accepting state (reverse BFS). ``DFAGuide`` (``forge.structured.guide``) builds its masks
from them."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from outlines_core import Index, Vocabulary
from outlines_core.json_schema import BOOLEAN, NULL, NUMBER, STRING

from forge.structured.base import ConstraintSpec, GrammarBuilder, GrammarError, GrammarTooLarge

INF = 1 << 30
# rough CPython sizes of the tables once unpickled: one inner-dict entry (key, value, slot), one state
_BYTES_PER_TRANSITION = 100
_BYTES_PER_STATE = 300


def json_object_regex(depth: int = 2) -> str:
    """Any JSON object whose values nest objects up to ``depth`` levels (arrays hold scalars).

    Written out here because outlines-core's regex for ``{"type": "object"}`` takes ~14 s to
    index over a byte vocabulary; this one takes ~1 s at depth 2."""
    ws = "[ ]?"
    scalar = f"({STRING}|{NUMBER}|{BOOLEAN}|{NULL})"
    array = rf"\[{ws}({scalar}({ws},{ws}{scalar})*)?{ws}\]"
    value = f"({scalar}|{array})"
    obj = ""
    for _ in range(max(depth, 1)):
        member = f"{STRING}{ws}:{ws}{value}"
        obj = rf"\{{{ws}({member}({ws},{ws}{member})*)?{ws}\}}"
        value = f"({scalar}|{array}|{obj})"
    return obj


def spec_to_regex(spec: ConstraintSpec, max_recursion_depth: int = 3) -> str:
    """The regex a spec compiles to (``json_object``: see ``json_object_regex``; a JSON schema:
    ``forge.structured.schema_regex``, which refuses what it cannot enforce)."""
    if spec.kind == "regex":
        return spec.value
    if spec.kind == "json_object":
        return json_object_regex(min(max_recursion_depth, 2))
    try:
        schema = json.loads(spec.value)
    except (ValueError, RecursionError) as exc:
        raise GrammarError("the JSON schema is not valid JSON") from exc
    from forge.structured.schema_regex import schema_regex  # (only a compile needs it; a config check imports dfa)

    try:
        return schema_regex(schema, max_recursion_depth)
    except RecursionError as exc:  # deep enum/const values; subschemas are bounded by schema_rules.MAX_DEPTH
        raise GrammarError("the JSON schema nests too deeply") from exc


def build_index(regex: str, tokens: list[bytes | None], eos_token_id: int) -> Index:
    vocab: dict[bytes, list[int]] = {}
    for i, b in enumerate(tokens):
        if b is not None and i != eos_token_id:
            vocab.setdefault(b, []).append(i)
    try:
        return Index(regex, Vocabulary(eos_token_id, vocab))
    except Exception as exc:
        raise GrammarError(f"the regex {regex[:64]!r} is invalid or uses an unsupported feature") from exc


@dataclass(frozen=True)
class DFATables:
    """A regex's token DFA: ``transitions[state][token] = next state`` (no EOS edges), accepting
    states, and ``dist[state]``, the fewest tokens from the state to an accepting one."""

    initial: int
    finals: frozenset[int]
    transitions: dict[int, dict[int, int]]
    dist: dict[int, int]

    @property
    def num_transitions(self) -> int:
        return sum(len(edges) for edges in self.transitions.values())

    @property
    def nbytes(self) -> int:
        """An estimate of the tables' memory in this process."""
        return _BYTES_PER_TRANSITION * self.num_transitions + _BYTES_PER_STATE * len(self.transitions)


def distances(transitions: dict[int, dict[int, int]], finals: Iterable[int]) -> dict[int, int]:
    """Fewest tokens from each state to one of ``finals`` (states that cannot reach one are absent)."""
    reverse: dict[int, set[int]] = {}
    for s, edges in transitions.items():
        for n in edges.values():
            reverse.setdefault(n, set()).add(s)
    dist = dict.fromkeys(finals, 0)
    queue = deque(dist)
    while queue:
        s = queue.popleft()
        for p in reverse.get(s, ()):
            if p not in dist:
                dist[p] = dist[s] + 1
                queue.append(p)
    return dist


def tables_from_index(index: Index, eos_token_ids: Iterable[int], max_states: int, what: str) -> DFATables:
    eos = set(eos_token_ids)
    raw = index.get_transitions()
    if len(raw) > max_states:
        raise GrammarTooLarge(
            f"{what} compiles to {len(raw)} DFA states, over the limit of {max_states}; "
            "simplify it or raise structured.max_states"
        )
    transitions = {s: {t: n for t, n in edges.items() if t not in eos} for s, edges in raw.items()}
    finals = frozenset(index.get_final_states())
    dist = distances(transitions, finals)
    initial = index.get_initial_state()
    if dist.get(initial, INF) >= INF:
        raise GrammarError("the pattern accepts no string this vocabulary can spell")
    return DFATables(initial, finals, transitions, dist)


def build_tables(
    regex: str, tokens: list[bytes | None], eos_token_ids: Iterable[int], max_states: int, what: str
) -> DFATables:
    """The DFA tables of ``regex``; ``GrammarTooLarge`` past ``max_states`` (``what`` names the
    grammar in that message)."""
    eos = sorted(set(eos_token_ids))
    return tables_from_index(build_index(regex, tokens, eos[0]), eos, max_states, what)


@dataclass(frozen=True)
class DFABuilder(GrammarBuilder):
    """Spec -> ``DFATables`` (torch-free: runs in the compile workers)."""

    tokens: list[bytes | None]
    eos_token_ids: frozenset[int]
    max_recursion_depth: int

    def build(self, spec: ConstraintSpec, max_states: int) -> DFATables:
        regex = spec_to_regex(spec, self.max_recursion_depth)
        return build_tables(regex, self.tokens, self.eos_token_ids, max_states, spec.description)
