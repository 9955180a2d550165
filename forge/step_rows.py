"""The rows of a step as the scheduler builds them (``forge.scheduler``'s working state)."""

from __future__ import annotations

from forge.outputs import DecodeRows, ScheduledRequest, StepTotals
from forge.request import Request


class StepRows:
    """The rows of the step the scheduler is building: ``decodes``, its first rows (plain decodes,
    column-wise), then ``rows`` (a plain decode after any other row joins these, keeping the order);
    their requests, in the same order; ``chunks``: the rows not on the plain-decode path, whose sums
    ``totals`` computes row by row."""

    __slots__ = ("chunks", "decode_requests", "decodes", "requests", "rows")

    def __init__(self) -> None:
        self.decodes = DecodeRows()
        self.decode_requests: list[Request] = []
        self.rows: list[ScheduledRequest] = []
        self.requests: list[Request] = []
        self.chunks: list[tuple[ScheduledRequest, Request]] = []

    def request_ids(self) -> set[str]:
        """The ids of the requests scheduled so far."""
        ids = set(self.decodes.request_ids)
        ids.update(s.request_id for s in self.rows)
        return ids

    def add_chunk(self, row: ScheduledRequest, request: Request) -> None:
        self.rows.append(row)
        self.requests.append(request)
        self.chunks.append((row, request))

    def totals(self, sum_decode_seq_lens: int) -> StepTotals:
        prompt = {r.request_id: r.num_prompt_tokens for _, r in self.chunks}
        return StepTotals.of([c for c, _ in self.chunks], prompt.__getitem__).plus_decodes(
            len(self.decodes) + len(self.rows) - len(self.chunks), sum_decode_seq_lens
        )
