"""A live server's files and batches over plain HTTP, for the store and ownership tests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.waiting import wait_until

TERMINAL = ("completed", "failed", "cancelled", "expired")
CMPL = "/v1/completions"


def line(custom_id: str, prompt: str = "Hello", max_tokens: int = 4, url: str = CMPL) -> str:
    """One batch input line: a greedy completion (``ignore_eos`` so its length is ``max_tokens``)."""
    request = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": request})


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in text.split("\n") if x.strip()]


@dataclass(frozen=True)
class Store:
    """``client``'s files and batches on a server whose state dir is ``state``."""

    client: httpx.Client
    state: Path

    def upload(self, text: str, headers: dict[str, str] | None = None) -> str:
        r = self.client.post(
            "/v1/files", files={"file": ("in.jsonl", text.encode())}, data={"purpose": "batch"}, headers=headers
        )
        assert r.status_code == 200, r.text
        return str(r.json()["id"])

    def create(self, file_id: str, headers: dict[str, str] | None = None) -> str:
        body = {"input_file_id": file_id, "endpoint": CMPL, "completion_window": "24h"}
        r = self.client.post("/v1/batches", json=body, headers=headers)
        assert r.status_code == 200, r.text
        return str(r.json()["id"])

    def batch(self, batch_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        r = self.client.get(f"/v1/batches/{batch_id}", headers=headers)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait(self, batch_id: str, statuses: tuple[str, ...] = TERMINAL, bound_s: float = 60) -> dict[str, Any]:
        wait_until(lambda: self.batch(batch_id)["status"] in statuses, lambda: str(self.batch(batch_id)), bound_s)
        return self.batch(batch_id)

    def wait_completed(self, batch_id: str, at_least: int) -> None:
        """Until ``at_least`` requests of the batch have ended (polled, so the batch may be past it)."""
        wait_until(lambda: self.batch(batch_id)["request_counts"]["completed"] >= at_least, f"{batch_id} stuck")

    def content(self, file_id: str | None) -> list[dict[str, Any]]:
        assert file_id is not None
        r = self.client.get(f"/v1/files/{file_id}/content")
        assert r.status_code == 200, r.text
        return jsonl(r.text)

    def run(self, text: str) -> dict[str, Any]:
        """Upload ``text``, batch it and wait for its end."""
        return self.wait(self.create(self.upload(text)))

    def record(self, batch_id: str) -> Path:
        return self.state / "batches" / f"{batch_id}.json"

    def results(self, batch_id: str) -> Path:
        return self.state / "batches" / f"{batch_id}.results.jsonl"


def raw(custom_id: str, prompt: str = "Hello") -> str:
    """A line with its non-ASCII characters written as they are (not as \\u escapes)."""
    return json.dumps(json.loads(line(custom_id, prompt)), ensure_ascii=False)


# (case, the line's custom_id as read back, the raw input line, its error code or None when answered)
LINE_CASES = (
    ("nested-3000", None, line("n")[:-2] + ', "x": ' + "[" * 3000 + "]" * 3000 + "}}", "invalid_json"),
    ("nested-3000-custom-id", None, '{"custom_id": ' + "[" * 3000 + "]" * 3000 + "}", "invalid_json"),
    ("u2028-in-prompt", "u2028", raw("u2028", "a\u2028b"), None),
    ("u0085-in-prompt", "u0085", raw("u0085", "a\u0085b"), None),
    ("u2029-in-custom-id", "a\u2029b", raw("a\u2029b"), None),
    ("crlf", "crlf", line("crlf") + "\r", None),
    ("nested-62", "n62", line("n62")[:-2] + ', "logit_bias": ' + "[" * 60 + "]" * 60 + "}}", None),
)
