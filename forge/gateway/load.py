"""The gateway's estimate of a backend's load between two polls of its ``/metrics``.

A poll's figures (``running``, ``waiting``, ``kv_usage``) are right when read and stale after: the gateway
itself sends requests there, and sees them finish, before the next poll. ``LoadBook`` keeps the gateway's
own requests on one backend, each marked with the poll it was sent after, and ``LoadBook.load()`` adds
what they change to the last poll's figures:

- a request sent after the last poll began (*fresh*) is not in its figures: it counts as waiting, and
  its KV tokens (its prompt, less the prefix the backend holds by the gateway's record) as KV in use,
  ``kv_tokens / kv_capacity_tokens`` (the backend's ``forge:cache_config_info``: ``block_size`` ×
  ``num_gpu_blocks``; without it the polled usage stands);
- a request sent before the last poll began that has finished since (*gone*) is in its figures: it
  leaves running (waiting once running is 0) and frees its KV tokens;
- a fresh request that finishes before the next poll only leaves the fresh count: no poll counted it.

A poll that answers with the figures replaces them and clears both counts, so the estimate is never
further off than one poll interval of the gateway's own traffic. Not estimated: the KV a request adds as
it decodes, the traffic a backend gets other than through this gateway, and the lag of the figures
themselves (a backend updates them after each engine step)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cost:
    """What the gateway counts for one request on the backend it sends it to."""

    tokens: int  # tokens still to compute: its prompt not in the backend's prefix cache, plus max_tokens
    kv_tokens: int  # KV tokens it takes once admitted: its prompt not in the backend's prefix cache


@dataclass(frozen=True)
class Ticket:
    """One request counted on a backend (``LoadBook.send``), to hand back to ``LoadBook.done``."""

    cost: Cost
    epoch: int  # the number of polls begun when it was sent


@dataclass(frozen=True)
class Polled:
    """A backend's figures from its ``/metrics``."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    kv_capacity_tokens: int = 0  # 0: not exposed


@dataclass(frozen=True)
class Load:
    """A backend's estimated load now: the last poll's figures with the gateway's requests since."""

    running: int
    waiting: int
    kv_usage: float


@dataclass
class _Tally:
    requests: int = 0
    kv_tokens: int = 0

    def add(self, cost: Cost, sign: int) -> None:
        self.requests += sign
        self.kv_tokens += sign * cost.kv_tokens


@dataclass
class LoadBook:
    """The gateway's requests in flight on one backend, and its estimate of the backend's load."""

    polled: Polled = field(default_factory=Polled)
    polls_answered: int = 0
    outstanding: int = 0  # the gateway's requests in flight there, from their send to their last byte
    outstanding_tokens: int = 0
    _begun: int = field(default=0, init=False)  # polls begun
    _counted: int = field(default=0, init=False)  # requests sent while fewer polls had begun are in ``polled``
    _fresh: dict[int, _Tally] = field(default_factory=dict, init=False)  # by epoch >= _counted: not in ``polled``
    _gone: _Tally = field(default_factory=_Tally, init=False)  # in ``polled``, finished since

    def send(self, cost: Cost) -> Ticket:
        """Counts a request sent now (before its answer starts)."""
        self.outstanding += 1
        self.outstanding_tokens += cost.tokens
        self._fresh.setdefault(self._begun, _Tally()).add(cost, 1)
        return Ticket(cost, self._begun)

    def done(self, ticket: Ticket) -> None:
        """Uncounts a request: answered to its end, failed, or given up."""
        self.outstanding -= 1
        self.outstanding_tokens -= ticket.cost.tokens
        if ticket.epoch < self._counted:
            self._gone.add(ticket.cost, 1)
            return
        tally = self._fresh[ticket.epoch]
        tally.add(ticket.cost, -1)
        if tally.requests == 0:
            del self._fresh[ticket.epoch]

    def poll_begun(self) -> int:
        """Marks a poll's start; its number, for ``poll_answered``."""
        self._begun += 1
        return self._begun

    def poll_answered(self, number: int, polled: Polled) -> None:
        """Takes poll ``number``'s figures: the requests sent before it began are in them."""
        self.polled = polled
        self.polls_answered += 1
        self._counted = number
        self._fresh = {epoch: t for epoch, t in self._fresh.items() if epoch >= number}
        self._gone = _Tally()

    def load(self) -> Load:
        fresh = _Tally(sum(t.requests for t in self._fresh.values()), sum(t.kv_tokens for t in self._fresh.values()))
        p, gone = self.polled, self._gone
        running = p.running - gone.requests
        waiting = max(0, p.waiting + min(0, running)) + fresh.requests
        kv = p.kv_usage
        if p.kv_capacity_tokens > 0:
            kv = min(1.0, max(0.0, kv + (fresh.kv_tokens - gone.kv_tokens) / p.kv_capacity_tokens))
        return Load(max(0, running), waiting, kv)
