"""What ``Scheduler.update`` returns: the step's outputs, the plain decodes' kept as their requests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from forge.outputs import RequestOutput
from forge.request import Request


def decode_output(request: Request) -> RequestOutput:
    """The output of a request whose step was a plain decode, right after ``update``: its one new
    token is its last, and it finished if and only if that token stopped it."""
    output = request.output_token_ids
    stopped = request.finished
    return RequestOutput(
        request.request_id,
        request.prompt_token_ids,
        output,
        output[-1:],
        stopped,
        request.status.value if stopped else None,
        "",
        request.num_cached_tokens,
    )


class StepOutputs(Sequence[RequestOutput]):
    """The step's outputs, one per sampling row, in row order: the plain decodes' first, kept as
    their requests (``decoded``, each having just appended one token; ``finished_decodes``: those
    that finished), then ``others``. A decode's ``RequestOutput`` is built from its request when
    first read (read them before the next step; ``finished`` builds only the finished ones), so a
    step of plain decodes builds no per-row object that nothing reads."""

    __slots__ = ("_outputs", "decoded", "finished_decodes", "others")

    def __init__(
        self,
        decoded: list[Request] | None = None,
        finished_decodes: list[Request] | None = None,
        others: list[RequestOutput] | None = None,
    ) -> None:
        self.decoded: list[Request] = decoded if decoded is not None else []
        self.finished_decodes: list[Request] = finished_decodes if finished_decodes is not None else []
        self.others: list[RequestOutput] = others if others is not None else []
        self._outputs: list[RequestOutput] | None = None

    @property
    def outputs(self) -> list[RequestOutput]:
        """Every output, as a list (built once)."""
        if self._outputs is None:
            self._outputs = [*map(decode_output, self.decoded), *self.others]
        return self._outputs

    @property
    def finished(self) -> list[RequestOutput]:
        """The outputs of the requests that finished this step, in row order."""
        if self._outputs is not None or not self.decoded:
            return [o for o in self.outputs if o.finished]
        return [*map(decode_output, self.finished_decodes), *(o for o in self.others if o.finished)]

    def __len__(self) -> int:
        return len(self.decoded) + len(self.others)

    @overload
    def __getitem__(self, index: int) -> RequestOutput: ...

    @overload
    def __getitem__(self, index: slice) -> list[RequestOutput]: ...

    def __getitem__(self, index: int | slice) -> RequestOutput | list[RequestOutput]:
        return self.outputs[index]

    def __iter__(self) -> Iterator[RequestOutput]:
        return iter(self.outputs)

    def __repr__(self) -> str:
        return f"StepOutputs({self.outputs!r})"
