"""benchmarks/vidur_transcribed_profile.py: a page-by-page transcription of the one-GPU rows of Vidur's
measured attention profile, checked for gaps and rebuilt in Vidur's schema; benchmarks/vidur_setup.sh takes
the rebuilt file only under its recorded digest."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import vidur_transcribed_profile as vtp
from benchmarks.vidur_attention_profile import COLUMNS

REPO = Path(__file__).resolve().parent.parent
# two pages: decode rows (kv 32, batch 1-3; kv 64, batch 1), then prefill rows (chunk 64, kv 0 and 32; chunk 80, kv 0)
PART = """0,1,0,32,F,0.009000000000000001
0,2,0,32,F,0.009000000000000001
0,3,0,32,F,0.012
16000,1,0,64,F,0.013
16000,1,64,0,T,0.024
16000,1,64,32,T,0.02
16000,1,80,0,T,0.10200000000000001
"""
PAGES = "0 3 1,0,32 3,0,32\n16000 4 1,0,64 1,80,0\n"


def write_parts(folder: Path, part: str, pages: str, duplicates: str | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part-00.csv").write_text(part)
    (folder / "pages-00.txt").write_text(pages)
    if duplicates is not None:
        (folder / "duplicates.txt").write_text(duplicates)
    return folder


def build(tmp_path: Path, part: str = PART, pages: str = PAGES, duplicates: str | None = None) -> Path:
    out = tmp_path / "attention.csv"
    vtp.main(["--parts", str(write_parts(tmp_path / "parts", part, pages, duplicates)), "--out", str(out)])
    return out


def test_rows_keep_vidurs_schema_their_order_and_the_median_vidur_reads(tmp_path: Path) -> None:
    df = pd.read_csv(build(tmp_path))
    assert list(df.columns) == [*COLUMNS, "text_id"]
    assert df.text_id.tolist() == list(range(7))
    assert df.batch_size.tolist() == [1, 2, 3, 1, 1, 1, 1]
    decode, prefill = df[~df.is_prefill], df[df.is_prefill]
    assert decode["time_stats.attn_decode.median"].tolist() == [
        0.009000000000000001,
        0.009000000000000001,
        0.012,
        0.013,
    ]
    assert decode["time_stats.attn_prefill.median"].isna().all()
    assert prefill["time_stats.attn_prefill.median"].tolist() == [0.024, 0.02, 0.10200000000000001]
    assert prefill.prefill_chunk_size.tolist() == [64, 64, 80]
    assert (df.num_tensor_parallel_workers == 1).all() and (df.n_embd == 4096).all()
    # Vidur's own loading (drop_duplicates, then its shape filter) keeps every row: two rows with one median stay two
    assert len(df.drop_duplicates()) == 7


def test_a_row_repeating_an_earlier_rows_text_is_dropped_as_vidur_drops_it(tmp_path: Path) -> None:
    # a second measurement of chunk 80 at kv 0, whole text identical to the first (row 6): Vidur's drop_duplicates
    # drops it from the source, so it must drop it here too; a row with the same median only must stay
    part, pages = PART + "16000,1,80,0,T,0.10200000000000001\n", PAGES.replace("16000 4", "16000 5")
    df = pd.read_csv(build(tmp_path, part, pages, duplicates="7 6\n"))
    assert df.text_id.tolist() == [0, 1, 2, 3, 4, 5, 6, 6]
    assert df.drop_duplicates().text_id.tolist() == list(range(7))
    with pytest.raises(SystemExit, match="row 2 cannot be a copy of row 1"):  # not the same shape
        build(tmp_path / "bad", part, pages, duplicates="2 1\n")


@pytest.mark.parametrize(
    ("part", "pages", "message"),
    [
        (PART.replace("0,2,0,32,F,0.009000000000000001\n", ""), PAGES, "page 0: 2 rows"),
        (PART, PAGES.replace("16000 4", "32000 4"), "not contiguous from 0"),
        (PART.replace("0,3,0,32", "0,4,0,32"), PAGES.replace("3,0,32\n", "4,0,32\n"), "decode rows out of sequence"),
        (
            PART.replace("1,64,32,T", "1,64,16,T").replace("1,80,0,T", "1,64,8,T"),
            PAGES.replace("1,80,0", "1,64,8"),
            "prefill rows out of sequence",
        ),
        (PART.replace("0.012", "0.012,ODD:4096,32,32,16,2,4096"), PAGES, "not PAGE,batch,chunk,kv,T|F,median"),
        (PART.replace("0.013", "O.013"), PAGES, "could not convert"),
    ],
    ids=["missing-row", "missing-page", "decode-gap", "prefill-order", "marked-odd", "not-a-number"],
)
def test_a_gap_or_a_marked_row_is_refused(tmp_path: Path, part: str, pages: str, message: str) -> None:
    with pytest.raises((SystemExit, ValueError), match=message):
        build(tmp_path, part, pages)
    assert not (tmp_path / "attention.csv").exists()


def test_a_folder_without_a_transcription_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no part-\\*.csv to rebuild the profile from"):
        vtp.main(["--parts", str(tmp_path), "--out", str(tmp_path / "attention.csv")])
    assert not (tmp_path / "attention.csv").exists()


def test_setup_takes_a_transcribed_profile_only_under_its_recorded_digest(tmp_path: Path) -> None:
    profile = build(tmp_path)
    env = {**os.environ, "VIDUR_VENV": str(tmp_path / "venv"), "VIDUR_SRC": str(tmp_path / "src")}
    cmd = ["bash", str(REPO / "benchmarks/vidur_setup.sh"), "--transcribed-attention", str(tmp_path / "no-mirror")]
    proc = subprocess.run([*cmd, str(profile)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "not the transcription's" in proc.stderr, proc.stderr
    assert not (tmp_path / "src").exists()
