"""From engine outputs back to text: incremental detokenization, stop strings (never emitted, with
text that could be the start of one held back), stop token ids, and logprobs (``Delta``, one step of
one choice). The request side (bodies to ``ChoiceSpec``s) is ``builder``'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from forge.core.outputs import RequestOutput
from forge.server.stops import StopHit, StopMatcher
from forge.tokenizers.base import IncrementalDetokenizer, Tokenizer


@dataclass
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    # on the choice's first delta when prompt logprobs were asked for (RequestOutput.prompt_logprobs)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_ranks: list[int | None] | None = None  # alongside prompt_logprobs (RequestOutput.prompt_ranks)

    @classmethod
    def merge(cls, parts: list[Delta]) -> Delta:
        """A whole choice as one delta; with no parts the choice ended without output (``abort``)."""
        return cls(
            "".join(d.text for d in parts),
            [t for d in parts for t in d.token_ids],
            [x for d in parts for x in d.logprobs],
            parts[-1].finish_reason if parts else "abort",
            next((d.prompt_logprobs for d in parts if d.prompt_logprobs is not None), None),
            next((d.prompt_ranks for d in parts if d.prompt_ranks is not None), None),
        )


class ChoiceText:
    """One choice's text as its tokens arrive. ``push`` returns what may be sent now; a matched
    stop string ends the choice (``finish_reason="stop"``; the caller aborts the request), and is
    part of the text only with ``include_stop_str``."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        stop_strings: list[str],
        stop_token_ids: Sequence[int],
        include_stop_str: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.min_tokens = min_tokens
        # the text's length once min_tokens tokens are out (None: not yet); a stop string ending
        # before it does not count (vLLM's rule: stop strings are not checked before min_tokens)
        self.checked_from: int | None = 0 if min_tokens == 0 else None
        self.matcher = StopMatcher(stop_strings) if stop_strings else None
        self.stop_token_ids = set(stop_token_ids)
        self.detok = IncrementalDetokenizer(tokenizer)
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.num_tokens = 0
        self.finish_reason: str | None = None
        self.include_stop_str = include_stop_str

    def push(self, out: RequestOutput) -> Delta:
        new = list(out.new_token_ids)
        self.num_tokens += len(new)
        shown = new
        if out.finished and out.finish_reason == "stop" and new and new[-1] in self.stop_token_ids:
            shown = new[:-1]
        self._extend(shown)
        if out.finished:
            full = self.tokenizer.decode(self.ids)
            if full.startswith(self.text):
                self.text = full
        text, matched = self._releasable(final=out.finished)
        reason = "stop" if matched else (out.finish_reason if out.finished else None)
        self.finish_reason = reason
        return Delta(text, new, list(out.logprobs or []), reason, out.prompt_logprobs, out.prompt_ranks)

    def _extend(self, shown: list[int]) -> None:
        """``shown`` detokenized onto the text; where the ``min_tokens``-th token falls among them,
        the text is cut there first, to note where stop strings start to count."""
        if self.matcher is not None and self.checked_from is None and len(self.ids) + len(shown) >= self.min_tokens:
            k = self.min_tokens - len(self.ids)
            self.ids.extend(shown[:k])
            self.text += self.detok.push(shown[:k])
            self.checked_from = len(self.text)
            shown = shown[k:]
        self.ids.extend(shown)
        self.text += self.detok.push(shown)

    def _next_stop(self, matcher: StopMatcher) -> StopHit | None:
        """The first stop string in the text fed on that ends past ``checked_from``."""
        while (hit := matcher.feed(self.text[matcher.fed :])) is not None:
            if self.checked_from is not None and hit.start + len(hit.stop) > self.checked_from:
                return hit
        return None

    def _releasable(self, final: bool) -> tuple[str, bool]:
        text = self.text
        limit = len(text)
        if self.matcher is not None:
            hit = self._next_stop(self.matcher)
            if hit is not None:
                end = hit.start + len(hit.stop) if self.include_stop_str else hit.start
                out = text[self.sent : end]
                self.text = text[:end]
                self.sent = end
                return out, True
            if not final:
                limit = len(text) - self.matcher.hold
        out = text[self.sent : max(limit, self.sent)]
        self.sent = max(self.sent, limit)
        return out, False
