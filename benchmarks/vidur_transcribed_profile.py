"""Vidur's measured A100 / Llama-2-7B attention profile, one-GPU rows, rebuilt from a transcription.

    python -m benchmarks.vidur_transcribed_profile --parts DIR --out attention.csv

Vidur's measured ``attention.csv`` (10,680,357 bytes, Git LFS) cannot be fetched here; the search
tool's file reader shows a public copy (github sw5sh/cs378-assignment3, same path) 16,000 characters
a look-up. Its rows come in blocks of ``num_tensor_parallel_workers`` (1, then 2, ...), and Vidur's
predictor keeps only the rows of the replica's tensor-parallel degree (1 here), of which it reads
only the shape columns and one median per row (``attn_decode`` for a decode row, ``attn_prefill``
for a prefill row: ``SklearnExecutionTimePredictor._train_attention_layer_models``). The first
2,736,000 characters (171 look-ups) hold every one-GPU row; those rows' shapes and medians were
transcribed page by page into ``DIR/part-KK.csv`` (``PAGE,batch,chunk,kv,T|F,median``, the median
copied as written) with ``DIR/pages-KK.txt`` (``PAGE ROWS FIRST LAST``) per page, and
``DIR/duplicates.txt``: ``ROW FIRST`` for each row whose whole source text (all 31 fields) is that of
an earlier row (checked against the full text of both; rows count from 0 in transcription order).

This module checks the transcription's structure (pages contiguous from offset 0, each page's row
count and first/last shapes as its page line says, no row marked other than a one-GPU
FLASH_ATTENTION row, the batch and kv sequences of each block without a gap) and writes Vidur's
schema: the same 31 columns in the same order, the medians filled in, every other statistic
empty (not transcribed, read by no predictor), plus ``text_id``: the row's index, or for a listed
duplicate its first copy's, so that Vidur's ``drop_duplicates`` drops exactly the rows it drops from
the source (two rows with one shape and median but different other statistics both stay). Vidur
trained on this file sees the source's one-GPU rows, in order, with the same medians: the same
forests as from the source file, for a one-GPU replica."""

from __future__ import annotations

import argparse
import csv
import itertools
from dataclasses import dataclass
from pathlib import Path

from benchmarks.digest import sha256_of
from benchmarks.vidur_attention_profile import COLUMNS

PAGE = 16_000
SHAPE = {"n_embd": 4096, "n_q_head": 32, "n_kv_head": 32, "block_size": 16, "num_tensor_parallel_workers": 1}
BACKEND = "AttentionBackend.FLASH_ATTENTION"


@dataclass(frozen=True)
class Row:
    """One transcribed row: its page, shape and median (as written in the source)."""

    page: int
    batch: int
    chunk: int
    kv: int
    prefill: bool
    median: str

    @property
    def shape(self) -> str:
        return f"{self.batch},{self.chunk},{self.kv}"


def read_part(path: Path) -> list[Row]:
    """A ``part-KK.csv``'s rows; refuses a row marked ODD or DUP, or one that is not six fields."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split(",")
        if len(fields) != 6 or fields[4] not in ("T", "F"):
            raise SystemExit(f"{path}:{n}: not PAGE,batch,chunk,kv,T|F,median: {line!r}")
        float(fields[5])  # a number, or this raises
        page, batch, chunk, kv = map(int, fields[:4])
        rows.append(Row(page, batch, chunk, kv, fields[4] == "T", fields[5]))
    return rows


def read_pages(path: Path) -> list[tuple[int, int, str, str]]:
    """A ``pages-KK.txt``'s lines: ``(page, rows, first shape, last shape)``."""
    out = []
    for line in path.read_text().splitlines():
        page, count, first, last = line.split()
        out.append((int(page), int(count), first, last))
    return out


def check_pages(rows: list[Row], pages: list[tuple[int, int, str, str]]) -> None:
    """Pages contiguous from 0; each page's rows as its page line says."""
    offsets = [p for p, *_ in pages]
    if offsets != list(range(0, PAGE * len(pages), PAGE)):
        raise SystemExit(f"pages are not contiguous from 0: {offsets[:3]} ... {offsets[-3:]}")
    by_page: dict[int, list[Row]] = {}
    for row in rows:
        by_page.setdefault(row.page, []).append(row)
    if set(by_page) - set(offsets):
        raise SystemExit(f"rows on pages no page line names: {sorted(set(by_page) - set(offsets))[:5]}")
    for page, count, first, last in pages:
        got = by_page.get(page, [])
        if len(got) != count or (got and (got[0].shape != first or got[-1].shape != last)):
            span = f"{got[0].shape}..{got[-1].shape}" if got else "none"
            raise SystemExit(f"page {page}: {len(got)} rows ({span}); its page line says {count} rows {first}..{last}")


def check_sequences(rows: list[Row]) -> None:
    """Decode rows: batch 1, 2, ... within each kv, a new kv starting at batch 1 (kv not falling); prefill
    rows: batch 1, kv rising within a chunk (or repeating once), a new chunk starting at kv 0."""
    for prev, row in itertools.pairwise(rows):
        if row.prefill != prev.prefill and not row.prefill:
            raise SystemExit(f"a decode row {row.shape} after a prefill row (page {row.page})")
        if not row.prefill:
            same_kv = row.kv == prev.kv and row.batch == prev.batch + 1
            new_kv = row.kv >= prev.kv and row.batch == 1  # (kv 1024 is measured twice)
            if not (same_kv or new_kv or prev.prefill):
                raise SystemExit(f"decode rows out of sequence: {prev.shape} then {row.shape} (page {row.page})")
        elif prev.prefill:
            same_chunk = row.chunk == prev.chunk and row.kv >= prev.kv
            new_chunk = row.kv == 0
            if row.batch != 1 or not (same_chunk or new_chunk):
                raise SystemExit(f"prefill rows out of sequence: {prev.shape} then {row.shape} (page {row.page})")


def read_duplicates(path: Path, rows: list[Row]) -> dict[int, int]:
    """``duplicates.txt``'s ``ROW FIRST`` lines (none if the file is absent), each checked: FIRST before
    ROW, the same shape, kind and median."""
    if not path.is_file():
        return {}
    pairs = {}
    for line in path.read_text().splitlines():
        row, first = map(int, line.split()[:2])
        if (
            not (0 <= first < row < len(rows))
            or rows[row].shape != rows[first].shape
            or ((rows[row].prefill, rows[row].median) != (rows[first].prefill, rows[first].median))
        ):
            raise SystemExit(f"{path}: row {row} cannot be a copy of row {first}")
        pairs[row] = first
    return pairs


def vidur_row(index: int, row: Row) -> list[str]:
    """The row in Vidur's schema: the one median, the shape columns, ``text_id`` (``index``)."""
    values = dict.fromkeys(COLUMNS, "")
    op = "attn_prefill" if row.prefill else "attn_decode"
    values[f"time_stats.{op}.median"] = row.median
    values |= {k: str(v) for k, v in SHAPE.items()}
    values |= {
        "max_model_len": "4096",
        "batch_size": str(row.batch),
        "prefill_chunk_size": str(row.chunk),
        "kv_cache_size": str(row.kv),
        "is_prefill": str(row.prefill),
        "attention_backend": BACKEND,
    }
    return [*values.values(), str(index)]


def pages_of(part: Path) -> Path:
    """``part-KK.csv``'s page lines, ``pages-KK.txt``."""
    return part.with_name(part.name.replace("part-", "pages-")).with_suffix(".txt")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", type=Path, required=True, help="the folder of part-KK.csv and pages-KK.txt")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    parts = sorted(args.parts.glob("part-*.csv"))
    if not parts:
        raise SystemExit(f"{args.parts}: no part-*.csv to rebuild the profile from")
    rows = [row for part in parts for row in read_part(part)]
    pages = [line for part in parts for line in read_pages(pages_of(part))]
    check_pages(rows, pages)
    check_sequences(rows)
    copies = read_duplicates(args.parts / "duplicates.txt", rows)
    with args.out.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow([*COLUMNS, "text_id"])
        writer.writerows(vidur_row(copies.get(i, i), row) for i, row in enumerate(rows))
    decode = sum(not r.prefill for r in rows)
    print(
        f"{len(rows)} rows ({decode} decode, {len(rows) - decode} prefill; {len(copies)} repeating an earlier row's "
        f"text) from {len(pages)} pages -> {args.out}"
    )
    print(f"sha256 {sha256_of(args.out)}")


if __name__ == "__main__":
    main()
