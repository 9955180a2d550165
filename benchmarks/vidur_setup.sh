#!/usr/bin/env bash
# Vidur (microsoft/vidur), runnable side by side with forge (issues 32 and 35), in its own venv:
#   bash benchmarks/vidur_setup.sh MIRROR_GIT_DIR ATTENTION_CSV
# - MIRROR_GIT_DIR: the git directory of a snapshot of github microsoft/vidur (the search tool's
#   `fetch`, e.g. /work/.mirror/microsoft+vidur/repo); its Python source and the profiles it has
#   (mlp.csv, the network CSVs) are copied out of HEAD with `git archive` (no build step);
# - ATTENTION_CSV: Vidur's A100 / Llama-2-7B attention.csv, a Git LFS object no snapshot holds
#   (10,680,357 bytes, sha256 4e3ddcf0...; a public copy sits at the same path in github
#   sw5sh/cs378-assignment3); checked against that digest and refused otherwise.
# Python dependencies come from PyPI (`vidur==0.0.26` pulls numpy, pandas, scikit-learn, ...).
# Where: VIDUR_VENV (default /work/vidur-venv), VIDUR_SRC (default /work/vidur-src). Nothing of
# Vidur's is written inside this repository. Rerunning is safe: each step is skipped when done.
set -euo pipefail

MIRROR=${1:?usage: vidur_setup.sh MIRROR_GIT_DIR ATTENTION_CSV}
ATTENTION=${2:?usage: vidur_setup.sh MIRROR_GIT_DIR ATTENTION_CSV}
VENV=${VIDUR_VENV:-/work/vidur-venv}
SRC=${VIDUR_SRC:-/work/vidur-src}
PROFILE=data/profiling/compute/a100/meta-llama/Llama-2-7b-hf
ATTENTION_SHA256=4e3ddcf049d5fcc3b86732523a126d7f49a07d12b17b489bf2a560d6dd9ecbf3

die() { echo "vidur_setup: $*" >&2; exit 1; }

[ -f "$ATTENTION" ] || die "attention.csv not found at $ATTENTION (Vidur's A100/Llama-2-7B profile; see docs/fidelity.md)"
sum=$(sha256sum "$ATTENTION" | cut -d' ' -f1)
[ "$sum" = "$ATTENTION_SHA256" ] || die "$ATTENTION has sha256 $sum, not Vidur's $ATTENTION_SHA256"
git --git-dir="$MIRROR" rev-parse --verify -q HEAD >/dev/null || die "$MIRROR is not a git directory"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import sklearn, pandas, fasteners, ddsketch" 2>/dev/null; then
    "$VENV/bin/pip" install -q vidur==0.0.26
    # keep its dependencies, drop the wheel itself: a different vidur (profiles from the Hugging Face hub)
    "$VENV/bin/pip" uninstall -y -q vidur
fi

mkdir -p "$SRC"
paths=(vidur "$PROFILE/mlp.csv" data/profiling/network/a100_pairwise_nvlink)
# (git names the snapshot's absent LFS blobs it passes on the way: not an error for these paths)
git --git-dir="$MIRROR" archive HEAD "${paths[@]}" 2> >(grep -v "^error: invalid object" >&2) | tar -x -C "$SRC"
cp "$ATTENTION" "$SRC/$PROFILE/attention.csv"
git --git-dir="$MIRROR" rev-parse HEAD > "$SRC/MIRROR_COMMIT"
# the checkout's source is the vidur the venv imports
(cd "$SRC" && "$VENV/bin/python" -c "import vidur.main, os; assert vidur.main.__file__ == os.path.abspath('vidur/main.py')")
echo "vidur ready: cd $SRC && $VENV/bin/python -m vidur.main ... (source at $(cat "$SRC/MIRROR_COMMIT"))"
