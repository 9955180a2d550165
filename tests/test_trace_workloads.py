"""Trace workloads: the shipped Azure traces, column mappings, gzip, datetimes, windows, shared
prefixes, and bad rows named by their line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from forge.config import ConfigError, compose_config
from forge.main import run_offline
from forge.tokenizers.base import ByteTokenizer
from forge.workloads.trace import TraceWorkload
from forge.workloads.trace_io import DATA_DIR

AZURE = {"arrival": "TIMESTAMP", "input_len": "ContextTokens", "output_len": "GeneratedTokens"}
TOK = ByteTokenizer(vocab_size=32000)


@pytest.mark.parametrize("kind", ["conv", "code"])
def test_the_shipped_azure_trace_matches_its_source_csv(kind: str) -> None:
    source = pd.read_csv(DATA_DIR / "azure" / f"AzureLLMInferenceTrace_{kind}.csv.gz")
    cfg = compose_config([f"workload=azure_{kind}"])
    trace = TraceWorkload(**{k: v for k, v in dict(cfg.workload).items() if k != "_target_"})
    specs = trace.requests(TOK)  # no length cap: every row
    assert len(specs) == len(source)
    assert [len(s.prompt_token_ids) for s in specs] == source["ContextTokens"].tolist()
    assert [s.output_len for s in specs] == source["GeneratedTokens"].tolist()
    stamps = pd.to_datetime(source["TIMESTAMP"])
    span = (stamps.iloc[-1] - stamps.iloc[0]).total_seconds()
    assert specs[0].arrival_time == 0.0
    assert specs[-1].arrival_time == pytest.approx(span, abs=1e-6)


def test_forge_runs_an_azure_trace_offline(tmp_path: Path) -> None:
    cfg = compose_config(
        [
            "workload=azure_code",
            "workload.max_requests=40",
            "model=synthetic",
            "clock=simulated",
            "progress=false",
            "report=false",
        ]
    )
    summary = run_offline(cfg, tmp_path)
    kept = pd.read_parquet(tmp_path / "requests.parquet")
    assert summary["num_requests"] == 40 == len(kept)
    source = pd.read_csv(DATA_DIR / "azure" / "AzureLLMInferenceTrace_code.csv.gz")
    fits = source[source["ContextTokens"] <= 2047].head(40)  # too_long=skip: the synthetic model takes 2,047
    assert sorted(kept["num_prompt_tokens"]) == sorted(fits["ContextTokens"])


def _write(path: Path, text: str) -> Path:
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_a_mapped_gzip_jsonl_trace_with_datetimes_window_scale_and_cap(tmp_path: Path) -> None:
    rows = [{"ts": f"2024-05-10T00:00:{s:02d}.5", "in": 10 + s, "out": 3} for s in range(0, 20, 2)]
    path = _write(tmp_path / "log.jsonl.gz", "\n".join(json.dumps(r) for r in rows) + "\n")
    trace = TraceWorkload(
        str(path), columns={"arrival": "ts", "input_len": "in", "output_len": "out"}, window_s=[4, 12], time_scale=0.5
    )
    specs = trace.requests(TOK)
    assert [s.arrival_time for s in specs] == [0.0, 1.0, 2.0, 3.0, 4.0]  # rows at 4..12 s, halved, from 4 s
    assert [len(s.prompt_token_ids) for s in specs] == [14, 16, 18, 20, 22]
    capped = TraceWorkload(str(path), columns={"arrival": "ts", "input_len": "in", "output_len": "out"}, max_requests=3)
    assert len(capped.requests(TOK)) == 3


def test_numeric_arrivals_in_milliseconds(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", "arrival_time,input_len,output_len\n0,5,2\n250,5,2\n1500,5,2\n")
    specs = TraceWorkload(str(path), time_unit="ms").requests(TOK)
    assert [s.arrival_time for s in specs] == [0.0, 0.25, 1.5]


def test_rows_sharing_a_prefix_hash_share_their_prefix(tmp_path: Path) -> None:
    text = "arrival_time,input_len,output_len,session,plen\n0,40,2,a,32\n1,50,2,b,32\n2,36,2,a,32\n3,60,2,b,16\n"
    path = _write(tmp_path / "t.csv", text)
    specs = TraceWorkload(str(path), columns={"prefix_hash": "session", "prefix_len": "plen"}).requests(TOK)
    a1, b1, a2, b2 = (s.prompt_token_ids for s in specs)
    assert a1[:32] == a2[:32] and a1[32:] != a2[32:36]
    assert b1[:16] == b2[:16] and b1[:32] != a1[:32]
    again = TraceWorkload(str(path), columns={"prefix_hash": "session", "prefix_len": "plen"}).requests(TOK)
    assert [s.prompt_token_ids for s in again] == [a1, b1, a2, b2]  # seeded: the same tokens on a rerun


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("arrival_time,input_len,output_len\n0,5,2\n2,5,2\n1,5,2\n", r"line 4: arrival goes back in time"),
        ("arrival_time,input_len,output_len\n-1,5,2\n0,5,2\n", r"line 2: negative arrival time"),
        ("arrival_time,input_len\n0,5\n", r"line 2: missing column 'output_len'"),
        ("arrival_time,input_len,output_len\n0,5,2\n1,five,2\n", r"line 3: input_len must be a number, got 'five'"),
        ("arrival_time,input_len,output_len\n0,5,2\n1,5,2.5\n", r"line 3: output_len must be a whole number"),
        ("arrival_time,input_len,output_len\n0,5,2\nyesterday,5,2\n", r"line 3: arrival 'yesterday' is neither"),
        ("arrival_time,input_len,output_len\n0,5,0\n", r"line 2: input_len and output_len must be >= 1"),
    ],
)
def test_bad_rows_are_named_by_line(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path / "bad.csv", text)
    with pytest.raises(ValueError, match=message):
        TraceWorkload(str(path)).requests(TOK)


def test_an_unsorted_trace_can_be_sorted_on_request(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", "arrival_time,input_len,output_len\n2,5,2\n1,6,2\n")
    specs = TraceWorkload(str(path), unsorted="sort").requests(TOK)
    assert [len(s.prompt_token_ids) for s in specs] == [6, 5]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+workload.columns.arrivals=TIMESTAMP", "workload.columns.arrivals: unknown field"),
        ("workload.time_scale=0", "workload.time_scale must be > 0"),
        ("workload.window_s=[5,1]", "workload.window_s must be"),
        ("workload.unsorted=maybe", "workload.unsorted must be one of"),
        ("workload.time_unit=h", "workload.time_unit must be one of"),
    ],
)
def test_bad_trace_settings_are_config_errors(tmp_path: Path, override: str, message: str) -> None:
    cfg = compose_config(
        ["workload=azure_conv", "model=synthetic", "clock=simulated", "progress=false", "report=false", override]
    )
    with pytest.raises(ConfigError, match=message):
        run_offline(cfg, tmp_path)


def test_a_missing_column_in_a_mapped_trace_names_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "az.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n")
    cfg = compose_config(["workload=azure_conv", f"workload.path={path}", "model=synthetic", "clock=simulated"])
    with pytest.raises(ConfigError, match="line 2: missing column 'GeneratedTokens'"):
        run_offline(cfg, tmp_path)
