"""Every shell and Python block of README.md and docs/**/*.md runs, or says why it does not
(``<!-- docs-test: skip (reason) -->`` on the line before it): no documented command or example can drift
from the code. Each page runs in its own temporary directory, so nothing is written into the checkout
(tests/docs_blocks.py; docs/contributing.md for writers)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.docs_blocks import Block, MarkerError, collect, doc_pages, run_page

ROOT = Path(__file__).resolve().parent.parent
PAGES = doc_pages(ROOT)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_block_of_the_page_runs_or_says_why_not(page: Path, tmp_path: Path) -> None:
    blocks = collect(page.read_text(), str(page.relative_to(ROOT)))
    failures = run_page(blocks, ROOT, tmp_path)
    assert not failures, "\n\n".join(failures)


def test_the_readme_tour_is_run_not_skipped() -> None:
    blocks = collect((ROOT / "README.md").read_text(), "README.md")
    run = [b for b in blocks if b.skip is None]
    assert sum(b.kind == "shell" for b in run) >= 3 and sum(b.kind == "python" for b in run) >= 1
    assert any("forge run -m" in b.code for b in run)


def checked(tmp_path: Path, text: str) -> tuple[list[Block], list[str]]:
    blocks = collect(text, "page.md")
    return blocks, run_page(blocks, ROOT, tmp_path)


def test_a_failing_block_fails_and_is_named(tmp_path: Path) -> None:
    _, failures = checked(tmp_path, "# p\n\n```bash\ntrue\n```\n\n```sh\nfalse\n```\n")
    assert len(failures) == 1 and failures[0].startswith("page.md:7 exited 1")
    _, failures = checked(tmp_path, "```python\nx = 1\n```\n\ntext\n\n```py\nassert x == 2\n```\n")
    assert len(failures) == 1 and "page.md:7 failed" in failures[0]


def test_skipped_blocks_do_not_run_and_need_a_reason(tmp_path: Path) -> None:
    blocks, failures = checked(tmp_path, "<!-- docs-test: skip (needs a server) -->\n\n```bash\nexit 3\n```\n")
    assert blocks[0].skip == "needs a server" and failures == []
    for marker in ("<!-- docs-test: skip -->", "<!-- docs-test: skip () -->", "<!-- docs-test: ignore (x) -->"):
        with pytest.raises(MarkerError):
            collect(f"{marker}\n```python\npass\n```\n", "page.md")


def test_blocks_share_a_session_in_a_temporary_directory(tmp_path: Path) -> None:
    text = (
        "```bash\necho hi > made.txt\n```\n```console\n$ test -f made.txt && \\\n  test -f run.py\nsome output\n```\n"
        "```python\nimport forge\nfrom pathlib import Path\nseen = Path('made.txt').read_text()\n```\n"
        "```python\nassert seen == 'hi\\n' and Path(forge.__file__).is_relative_to(" + repr(str(ROOT)) + ")\n```\n"
    )
    blocks, failures = checked(tmp_path, text)
    assert [b.kind for b in blocks] == ["shell", "shell", "python", "python"] and failures == []
    assert (tmp_path / "made.txt").exists() and not (ROOT / "made.txt").exists()


def test_only_shell_and_python_blocks_are_collected_and_nested_fences_are_text() -> None:
    text = "```yaml\na: 1\n```\n\n````markdown\n```bash\nfalse\n```\n````\n\n```\nplain\n```\n~~~python\npass\n~~~\n"
    assert [(b.label, b.kind) for b in collect(text, "p.md")] == [("p.md:14", "python")]


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in "ZX"


def test_what_a_block_leaves_running_is_stopped(tmp_path: Path) -> None:
    _, failures = checked(tmp_path, "```bash\nsleep 300 &\necho $! > pid\n```\n")
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10  # SIGKILL lands when the process next runs: on a busy machine, later
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert failures == [] and not running(pid)
