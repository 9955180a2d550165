from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import jsonschema
import pytest

from forge import LLM, SamplingParams


def test_generate_strings_and_token_lists() -> None:
    llm = LLM("model=tiny", "kvcache=naive")
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts: list[str | list[int]] = ["Hello, forge", [256, 72, 105]]
    outs = llm.generate(prompts, params)
    assert len(outs) == 2
    for out in outs:
        assert len(out.token_ids) == 8
        assert isinstance(out.text, str)
        assert out.finish_reason == "length"
    again = llm.generate("Hello, forge", params)
    assert again[0].token_ids == outs[0].token_ids


def test_seeded_sampling_is_reproducible_and_batch_independent() -> None:
    llm = LLM("model=tiny")
    p = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=123, ignore_eos=True)
    alone = llm.generate("abc", p)[0].token_ids
    crowd = llm.generate(["zzz", "abc", "qq"], [SamplingParams(max_tokens=5, temperature=1.0), p, p])
    assert crowd[1].token_ids == alone
    other_seed = llm.generate("abc", SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True))
    assert other_seed[0].token_ids != alone


def test_stop_token_ids_end_generation() -> None:
    llm = LLM("model=synthetic")
    free = llm.generate("hello", SamplingParams(max_tokens=20, temperature=0.0))[0]
    stop_at = free.token_ids[5]
    first = free.token_ids.index(stop_at)
    stopped = llm.generate("hello", SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[stop_at]))[0]
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"


def test_unseeded_sampling_is_the_same_in_every_process() -> None:
    """Request seeds come from a stable hash of the request id, not Python's per-process ``hash``."""
    code = (
        "from forge import LLM; print([o.token_ids for o in LLM('sampling=random').generate(['Hello there', 'abc'])])"
    )
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outs.append(done.stdout.strip().splitlines()[-1])
    assert outs[0] == outs[1]


# -- library parity with the server: stop strings, streaming, chat, structured output (issue 23) -----
GREEDY = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)


def _ascii_pair(text: str, start: int) -> str:
    """The first two printable ASCII characters in a row at or after ``start``."""
    for i in range(start, len(text) - 1):
        if text[i : i + 2].isascii() and text[i : i + 2].isprintable():
            return text[i : i + 2]
    raise AssertionError(f"no printable ASCII pair in {text!r}")


def test_stop_strings_end_the_text_and_are_never_emitted() -> None:
    llm = LLM("model=synthetic")
    free = llm.generate("hello there", GREEDY)[0]
    stop = _ascii_pair(free.text, 4)
    cut = free.text.index(stop)
    stopped = llm.generate("hello there", dataclasses.replace(GREEDY, stop=["never-there", stop]))[0]
    assert stopped.text == free.text[:cut]
    assert stop not in stopped.text
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert len(stopped.token_ids) < len(free.token_ids)
    streamed = "".join(d.text for d in llm.stream("hello there", dataclasses.replace(GREEDY, stop=[stop])))
    assert streamed == stopped.text
    assert not llm.engine.has_unfinished()


def test_sampling_params_refuse_bad_text_options() -> None:
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=[""])
    with pytest.raises(ValueError, match="at most one"):
        SamplingParams(json_schema={"type": "object"}, regex="a+")


def test_stream_yields_what_generate_returns() -> None:
    llm = LLM("model=synthetic")
    params = [GREEDY, dataclasses.replace(GREEDY, max_tokens=7, n=2, temperature=1.0, seed=3)]
    whole = llm.generate(["one prompt", "another"], params)
    deltas = list(llm.stream(["one prompt", "another"], params))
    assert {d.index for d in deltas} == {0, 1, 2}
    for index, out in enumerate(whole):
        mine = [d for d in deltas if d.index == index]
        assert "".join(d.text for d in mine) == out.text
        assert [t for d in mine for t in d.token_ids] == out.token_ids
        assert [d.finish_reason for d in mine] == [None] * (len(mine) - 1) + ["length"]
    assert len([d for d in deltas if d.index == 0]) > 1  # one delta per step, not one at the end


def test_closing_a_stream_early_aborts_its_requests() -> None:
    llm = LLM("model=synthetic")
    stream = llm.stream(["a", "b"], GREEDY)
    next(stream)
    assert llm.engine.has_unfinished()
    stream.close()
    assert not llm.engine.has_unfinished()
    assert len(llm.generate("c", GREEDY)[0].token_ids) == GREEDY.max_tokens


def test_chat_renders_the_chat_template() -> None:
    llm = LLM("model=tiny")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    reply = llm.chat(messages, GREEDY)
    prompt = llm.tokenizer.encode(llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    assert reply[0].prompt_token_ids == prompt
    assert reply[0].token_ids == llm.generate([prompt], GREEDY)[0].token_ids
    both = llm.chat([messages, [{"role": "user", "content": "Other"}]], GREEDY)
    assert [o.token_ids for o in both[:1]] == [reply[0].token_ids] and len(both) == 2


def test_generate_with_a_regex_or_json_schema_matches_it() -> None:
    llm = LLM("model=tiny")
    out = llm.generate("Phone:", SamplingParams(max_tokens=24, temperature=0.0, regex=r"[0-9]{3}-[a-c]+"))[0]
    assert re.fullmatch(r"[0-9]{3}-[a-c]+", out.text), out.text
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    out = llm.generate("JSON:", SamplingParams(max_tokens=64, temperature=0.0, json_schema=schema))[0]
    jsonschema.validate(json.loads(out.text), schema)


def test_structured_output_longer_than_max_tokens_is_cut_with_length_as_the_server_does() -> None:
    llm = LLM("model=tiny")
    out = llm.generate("abc", SamplingParams(max_tokens=3, regex="hello world"))[0]
    assert (out.text, out.finish_reason) == ("hel", "length")
    whole = llm.generate("abc", SamplingParams(max_tokens=20, regex="hello world"))[0]
    assert (whole.text, whole.finish_reason) == ("hello world", "stop")
    assert not llm.engine.has_unfinished()
