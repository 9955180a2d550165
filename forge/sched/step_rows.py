"""The rows of a step as the scheduler builds them (``forge.sched.scheduler``'s working state)."""

from __future__ import annotations

from forge.core.outputs import DecodeRows, ScheduledRequest
from forge.core.request import Request


class StepRows:
    """The step the scheduler is building: ``decodes``, its first rows (plain decodes, column-wise,
    with their requests), then ``rows`` (every other row; a plain decode after any other row joins
    these, keeping the order) and ``requests``, the request of each of ``rows``."""

    __slots__ = ("decodes", "requests", "rows")

    def __init__(self) -> None:
        self.decodes = DecodeRows()
        self.rows: list[ScheduledRequest] = []
        self.requests: list[Request] = []

    @property
    def is_empty(self) -> bool:
        return not self.rows and not self.decodes

    def request_ids(self) -> set[str]:
        """The ids of the requests scheduled so far."""
        ids = set(self.decodes.request_ids)
        ids.update(s.request_id for s in self.rows)
        return ids

    def add_chunk(self, row: ScheduledRequest, request: Request) -> None:
        self.rows.append(row)
        self.requests.append(request)

    def add_decode(self, request: Request, block_table: list[int], group_tables: tuple[list[int], ...] = ()) -> None:
        """A plain decode of ``request`` (``Request.is_decoding``) through ``block_table`` (and the
        other KV cache groups' ``group_tables``, given for every decode or for none)."""
        rid, start, token = request.request_id, request.num_computed_tokens, request.output_token_ids[-1]
        if self.rows:  # after another row: keep the order
            row = ScheduledRequest(rid, start, 1, [token], block_table, True, group_tables=group_tables)
            self.add_chunk(row, request)
            return
        d = self.decodes
        d.request_ids.append(rid)
        d.starts.append(start)
        d.token_ids.append(token)
        d.block_tables.append(block_table)
        d.requests.append(request)
        if group_tables:
            d.group_tables.append(group_tables)
