"""The rows of a step as the scheduler builds them (``forge.sched.scheduler``'s working state)."""

from __future__ import annotations

from forge.core.outputs import DecodeRows, ScheduledRequest
from forge.core.request import Request


class StepRows:
    """The step the scheduler is building: first the plain decodes, column-wise (``decode_requests``
    and their ``decode_tables``; ``decodes()`` gives them as ``DecodeRows``), then ``rows`` (every
    other row) and ``requests``, the request of each of ``rows``. Every plain decode is column-wise,
    whenever it is added (vLLM's batch layout: decodes first), so a step has one representation of
    its decodes."""

    __slots__ = ("decode_group_tables", "decode_requests", "decode_tables", "requests", "rows")

    def __init__(self) -> None:
        self.decode_requests: list[Request] = []
        self.decode_tables: list[list[int]] = []
        self.decode_group_tables: list[tuple[list[int], ...]] = []  # with several KV cache groups
        self.rows: list[ScheduledRequest] = []
        self.requests: list[Request] = []

    @property
    def is_empty(self) -> bool:
        return not self.rows and not self.decode_requests

    def request_ids(self) -> set[str]:
        """The ids of the requests scheduled so far."""
        ids = {r.request_id for r in self.decode_requests}
        ids.update(s.request_id for s in self.rows)
        return ids

    def add_chunk(self, row: ScheduledRequest, request: Request) -> None:
        """``row`` of ``request``, the next of ``rows``; a plain decode's row (``Request.is_decoding``:
        e.g. a swapped-in or a preempting decode) goes column-wise instead (``add_decode``)."""
        if request.is_decoding:
            self.add_decode(request, row.block_table, row.group_tables)
            return
        self.rows.append(row)
        self.requests.append(request)

    def add_decode(self, request: Request, block_table: list[int], group_tables: tuple[list[int], ...] = ()) -> None:
        """A plain decode of ``request`` (``Request.is_decoding``) through ``block_table`` (and the
        other KV cache groups' ``group_tables``, given for every decode or for none): a column-wise
        row (the scheduler may append to ``decode_requests`` and ``decode_tables`` itself, when the
        cache has one group)."""
        self.decode_requests.append(request)
        self.decode_tables.append(block_table)
        if group_tables:
            self.decode_group_tables.append(group_tables)

    def decodes(self) -> DecodeRows:
        """The column-wise decodes, read from their requests (call before any of them changes)."""
        requests = self.decode_requests
        if not requests:  # a step of chunks only (e.g. a prefill-only step)
            return DecodeRows([], [], [], self.decode_tables, requests, self.decode_group_tables)
        return DecodeRows(
            [r.request_id for r in requests],
            [r.num_computed_tokens for r in requests],
            [r.output_token_ids[-1] for r in requests],
            self.decode_tables,
            requests,
            self.decode_group_tables,
        )
