"""python -m forge.batch INPUT OUTPUT [overrides]: vLLM's run-batch convention, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forge import LLM, SamplingParams
from forge.batch import main
from tests.store_helpers import LINE_CASES, line


def test_offline_batch_answers_every_line_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def line(custom_id: str, url: str, body: dict[str, object]) -> str:
        return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})

    prompts = ["Hello", "abc", "forge"]
    lines = [
        line(p, "/v1/completions", {"model": "tiny", "prompt": p, "max_tokens": 7, "temperature": 0}) for p in prompts
    ]
    lines.insert(1, "not json")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    lines.append(line("chat", "/v1/chat/completions", chat))
    lines.append(line("wrong-model", "/v1/completions", {"model": "gpt-4o", "prompt": "x"}))
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines) + "\n")

    assert main([str(source), str(target), "model=tiny", "engine.max_num_seqs=4"]) == 0
    out = [json.loads(x) for x in target.read_text().splitlines()]
    assert [o["custom_id"] for o in out] == ["Hello", None, "abc", "forge", "chat", "wrong-model"]
    assert out[1]["response"] is None and out[1]["error"]["line"] == 2
    expected = LLM("model=tiny").generate(prompts, SamplingParams(max_tokens=7, temperature=0.0))
    for o, e in zip([out[0], out[2], out[3]], expected, strict=True):
        assert o["error"] is None and o["response"]["status_code"] == 200
        assert o["response"]["body"]["choices"][0]["text"] == e.text
    assert out[4]["response"]["body"]["object"] == "chat.completion"
    assert out[5]["response"]["status_code"] == 404
    assert "6 requests: 4 succeeded, 2 failed" in capsys.readouterr().err


def test_offline_batch_usage_and_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("")
    assert main([str(source)]) == 2
    assert main([str(source), str(tmp_path / "out.jsonl"), "engine.no_such_setting=1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("config error:")
    assert main([str(tmp_path / "missing.jsonl"), str(tmp_path / "out.jsonl")]) == 2  # unreadable input


@pytest.mark.parametrize("case", [c[0] for c in LINE_CASES])
def test_offline_batch_reads_odd_lines_one_by_one(tmp_path: Path, case: str) -> None:
    """Each odd line (``store_helpers.LINE_CASES``) between two plain ones: a line nested 3,000
    deep is that line's error, a raw U+2028 / U+0085 / U+2029 in a string does not split it."""
    _, custom_id, text, code = next(c for c in LINE_CASES if c[0] == case)
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join([line("before"), text, line("after")]) + "\n", encoding="utf-8")
    assert main([str(source), str(target), "model=tiny"]) == 0
    out = [json.loads(x) for x in target.read_text(encoding="utf-8").split("\n") if x]
    assert [o["custom_id"] for o in out] == ["before", custom_id, "after"]
    if code is None:
        assert out[1]["error"] is None and out[1]["response"] is not None
    else:
        assert (
            out[1]["error"]["code"] == code and out[1]["error"]["line"] == 2 and "nests" in out[1]["error"]["message"]
        )
