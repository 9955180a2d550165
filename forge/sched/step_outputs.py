"""What ``Scheduler.update`` returns: the step's outputs, the plain decodes' kept column-wise."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from forge.core.outputs import RequestOutput
from forge.core.request import Request


class StepOutputs(Sequence[RequestOutput]):
    """The step's outputs, one per sampling row, in row order: the plain decodes' first, kept
    column-wise (``decoded``: their requests; ``decode_tokens``: the one token each appended;
    ``finished_decodes``: those that finished), then ``others``. A decode's ``RequestOutput`` is built
    when first read, from what the step decided (its token, whether it finished) rather than from
    the request's state then, so it reads the same a step later; ``token_ids`` is the request's
    output list, shared as in every ``RequestOutput``. ``finished`` builds only the finished ones,
    so a step of plain decodes builds no per-row object that nothing reads."""

    __slots__ = ("_outputs", "decode_tokens", "decoded", "finished_decodes", "logprobs", "others")

    def __init__(
        self,
        decoded: list[Request] | None = None,
        decode_tokens: list[int] | None = None,
        finished_decodes: list[Request] | None = None,
        others: list[RequestOutput] | None = None,
        logprobs: dict[str, list[dict[int, float]]] | None = None,
    ) -> None:
        """``logprobs``: per request id, the logprobs of its new tokens (the decodes' among them)."""
        self.decoded: list[Request] = decoded if decoded is not None else []
        self.decode_tokens: list[int] = decode_tokens if decode_tokens is not None else []
        if len(self.decode_tokens) != len(self.decoded):
            raise ValueError(f"{len(self.decoded)} decoded requests but {len(self.decode_tokens)} tokens")
        self.finished_decodes: list[Request] = finished_decodes if finished_decodes is not None else []
        self.others: list[RequestOutput] = others if others is not None else []
        self.logprobs = logprobs or {}
        self._outputs: list[RequestOutput] | None = None

    def _decode_output(self, request: Request, token: int, finished: bool) -> RequestOutput:
        rid = request.request_id
        lps = self.logprobs.get(rid)
        return RequestOutput(
            rid,
            request.prompt_token_ids,
            request.output_token_ids,
            [token],
            finished,
            request.status.value if finished else None,
            "",
            request.num_cached_tokens,
            lps[:1] if lps is not None else None,
            prompt_cached_tokens=request.prompt_cached_tokens or 0,
        )

    def with_others(self, extra: list[RequestOutput]) -> StepOutputs:
        """These outputs followed by ``extra`` (e.g. the requests that failed this step)."""
        return StepOutputs(self.decoded, self.decode_tokens, self.finished_decodes, self.others + extra, self.logprobs)

    @property
    def outputs(self) -> list[RequestOutput]:
        """Every output, as a list (built once)."""
        if self._outputs is None:
            done = {id(r) for r in self.finished_decodes}
            decodes = [
                self._decode_output(r, t, id(r) in done) for r, t in zip(self.decoded, self.decode_tokens, strict=True)
            ]
            self._outputs = decodes + self.others
        return self._outputs

    @property
    def finished(self) -> list[RequestOutput]:
        """The outputs of the requests that finished this step, in row order."""
        if self._outputs is not None:
            return [o for o in self._outputs if o.finished]
        # A finished request appends nothing more: its last token is the one this step appended.
        others = [o for o in self.others if o.finished]
        if not self.finished_decodes:
            return others
        return [self._decode_output(r, r.output_token_ids[-1], True) for r in self.finished_decodes] + others

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
