"""llama.cpp's server tests against ``forge serve``, classified: ``python -m benchmarks.conformance_llama_cpp``.

The tests come from llama-cpp-python's sdist on PyPI (it vendors llama.cpp, tests included): the
file is downloaded once into ``--cache`` (default ``$FORGE_CACHE_DIR`` or ``~/.cache/forge``, then
``conformance/``), checked against the sha256 pinned here, and only
``vendor/llama.cpp/tools/server/tests`` and the chat templates its tests read
(``vendor/llama.cpp/models/templates``) are extracted. pytest runs the tests there with the adapter
plugin (``benchmarks/conformance_llama_cpp_adapter.py``), which starts forge servers in
llama-server's place; each result is classed (``benchmarks/conformance_llama_cpp_classes.py`` and
the rules in ``benchmarks/conformance_llama_cpp.toml``) and the table is written to ``--out`` as
``conformance-llama-cpp.{md,csv,json}`` (``conformance-llama-cpp-smollm2.*`` with
``--model smollm2``). Exit status 1 when a test is classed ``forge-bug``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from benchmarks.conformance_llama_cpp_classes import classify, load_rules
from benchmarks.conformance_llama_cpp_report import STEM, write_reports
from benchmarks.digest import sha256_of

ROOT = Path(__file__).resolve().parent.parent
SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_JSON = "https://pypi.org/pypi/llama-cpp-python/0.3.36/json"
LLAMA_CPP_IN_SDIST = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
# the server tests, and the chat templates their tool-calling tests read (../../../models/templates)
EXTRACTED = ("tools/server/tests/", "models/templates/")


def default_cache() -> Path:
    base = os.environ.get("FORGE_CACHE_DIR") or str(Path.home() / ".cache" / "forge")
    return Path(base) / "conformance"


def sdist_url() -> str:
    """The sdist's address from PyPI's JSON API (its ``url`` may be relative to the JSON's)."""
    with urllib.request.urlopen(SDIST_JSON, timeout=60) as r:
        files = json.load(r)["urls"]
    url = str(next(f["url"] for f in files if f["packagetype"] == "sdist"))
    return urllib.parse.urljoin(SDIST_JSON, url)


def _checked(path: Path) -> Path:
    found = sha256_of(path)
    if found != SDIST_SHA256:
        path.unlink()
        raise SystemExit(f"{path.name}: sha256 {found}, expected {SDIST_SHA256} (not kept)")
    return path


def fetch_sdist(cache: Path, local: Path | None = None) -> Path:
    """The pinned sdist in ``cache`` (copied from ``local`` or downloaded); a file whose sha256 is not the
    pinned one is deleted and refused."""
    target = cache / SDIST
    if target.exists():
        return _checked(target)
    cache.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    if local is not None:
        partial.write_bytes(local.read_bytes())
    else:
        urllib.request.urlretrieve(sdist_url(), partial)
    return _checked(partial).replace(target)


def extract_tests(sdist: Path, cache: Path) -> Path:
    """llama.cpp's server tests folder (with the chat templates beside it as in llama.cpp's tree),
    extracted once next to the sdist."""
    dest = cache / "llama-cpp-0.3.36"
    tests = dest / EXTRACTED[0]
    if not (tests / "utils.py").exists():
        with tarfile.open(sdist) as tar:
            members = []
            for m in tar.getmembers():
                name = m.name.removeprefix(LLAMA_CPP_IN_SDIST)
                if name != m.name and name.startswith(EXTRACTED) and name not in EXTRACTED:
                    m.name = name
                    members.append(m)
            tar.extractall(dest, members=members, filter="data")
    (tests / "tmp").mkdir(exist_ok=True)  # llama.cpp's tests write there (utils.TMP_DIR)
    return tests


def run_suite(tests_dir: Path, work: Path, model: str, selection: list[str], keyword: str | None) -> list[dict]:
    """pytest over the selection with the adapter; the results it wrote."""
    env = {**os.environ, "FORGE_LLAMA_CPP_OUT": str(work), "FORGE_LLAMA_CPP_MODEL": model}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-p", "benchmarks.conformance_llama_cpp_adapter", "-p", "no:cacheprovider"]
    cmd += ["-q", "-rN", *(["-k", keyword] if keyword else []), *selection]
    subprocess.run(cmd, cwd=tests_dir, env=env, check=False)
    return list(json.loads((work / "results.json").read_text()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tests", nargs="*", default=["unit"], help="test files or ids, relative to tools/server/tests")
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny", help="the model forge serves")
    p.add_argument("-k", dest="keyword", help="pytest's -k expression")
    p.add_argument("--cache", type=Path, default=None, help="where the sdist and the tests are kept")
    p.add_argument("--sdist", type=Path, default=None, help="a local copy of the sdist (checked against the pin)")
    p.add_argument(
        "--output-dir",
        "--out",
        dest="out",
        type=Path,
        default=None,
        help="where the reports go (default: outputs/bench/conformance-llama-cpp-<date>-<time>; "
        "the committed ones: --output-dir reports/serve)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cache = args.cache or default_cache()
    tests_dir = extract_tests(fetch_sdist(cache, args.sdist), cache)
    work = cache / f"run-{os.getpid()}"
    start, load = time.monotonic(), os.getloadavg()[0]
    results = run_suite(tests_dir, work, args.model, args.tests, args.keyword)
    verdicts = [classify(r, load_rules()) for r in results]
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "benchmarks.conformance_llama_cpp", *given])
    run = {"command": command, "model": args.model, "wall_s": time.monotonic() - start, "load": load}
    run |= {"load_after": os.getloadavg()[0], "sdist": f"{SDIST} (sha256 {SDIST_SHA256})", "logs": str(work / "logs")}
    stem = STEM if args.model == "tiny" else f"{STEM}-{args.model}"
    out = args.out or Path("outputs/bench") / f"conformance-llama-cpp-{time.strftime('%Y%m%d-%H%M%S')}"
    write_reports(verdicts, load_rules(), run, out / stem)
    return 1 if any(v.klass == "forge-bug" for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
