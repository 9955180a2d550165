#!/usr/bin/env bash
# Vidur (microsoft/vidur), runnable side by side with forge (issues 32 and 35), in its own venv:
#   bash benchmarks/vidur_setup.sh MIRROR_GIT_DIR ATTENTION_CSV
#   bash benchmarks/vidur_setup.sh --computed-attention MIRROR_GIT_DIR COMPUTED_CSV
#   bash benchmarks/vidur_setup.sh --transcribed-attention MIRROR_GIT_DIR TRANSCRIBED_CSV
# - MIRROR_GIT_DIR: the git directory of a snapshot of github microsoft/vidur (the search tool's
#   `fetch`, e.g. /work/.mirror/microsoft+vidur/repo); its Python source and the profiles it has
#   (mlp.csv, the network CSVs) are copied out of HEAD with `git archive` (no build step);
# - ATTENTION_CSV: Vidur's A100 / Llama-2-7B attention.csv, a Git LFS object no snapshot holds
#   (10,680,357 bytes, sha256 4e3ddcf0...; a public copy sits at the same path in github
#   sw5sh/cs378-assignment3); checked against that digest and refused otherwise;
# - or, with --computed-attention, COMPUTED_CSV: the attention profile forge's own A100 cost model
#   gives (`python -m benchmarks.vidur_attention_profile --out FILE`); refused unless its digest is
#   that of the file this checkout computes now. Vidur then charges attention as forge does: a
#   cross-check of everything else, not a validation against Vidur's measurements;
# - or, with --transcribed-attention, TRANSCRIBED_CSV: the one-GPU rows of Vidur's measured profile,
#   their shapes and medians transcribed from the public copy page by page and rebuilt in Vidur's
#   schema (`python -m benchmarks.vidur_transcribed_profile`, which documents what that keeps);
#   refused unless its digest is the one recorded below (reports/cluster_fidelity/README.md).
# Which of the two is installed is written to $VIDUR_SRC/ATTENTION_PROFILE (label, sha256, origin);
# experiments/vidur_reference.py checks the file against it and copies it into every reference.
# Python dependencies come from PyPI (`vidur==0.0.26` pulls numpy, pandas, scikit-learn, ...).
# Where: VIDUR_VENV (default /work/vidur-venv), VIDUR_SRC (default /work/vidur-src). Nothing of
# Vidur's is written inside this repository. Rerunning is safe: each step is skipped when done.
set -euo pipefail

USAGE="usage: vidur_setup.sh [--computed-attention|--transcribed-attention] MIRROR_GIT_DIR ATTENTION_CSV"
LABEL=measured
if [ "${1:-}" = "--computed-attention" ]; then
    LABEL=computed
    shift
elif [ "${1:-}" = "--transcribed-attention" ]; then
    LABEL=transcribed
    shift
fi
MIRROR=${1:?$USAGE}
ATTENTION=${2:?$USAGE}
VENV=${VIDUR_VENV:-/work/vidur-venv}
SRC=${VIDUR_SRC:-/work/vidur-src}
PROFILE=data/profiling/compute/a100/meta-llama/Llama-2-7b-hf
ATTENTION_SHA256=4e3ddcf049d5fcc3b86732523a126d7f49a07d12b17b489bf2a560d6dd9ecbf3
TRANSCRIBED_SHA256=5ee9f9cda3c8fc4258926a39f95bf56831b981ba393fc3ce5a3e5e0c5e502b8c
FORGE=$(cd "$(dirname "$0")/.." && pwd)

die() { echo "vidur_setup: $*" >&2; exit 1; }

[ -f "$ATTENTION" ] || die "attention.csv not found at $ATTENTION (Vidur's A100/Llama-2-7B profile; see docs/fidelity.md)"
sum=$(sha256sum "$ATTENTION" | cut -d' ' -f1)
if [ "$LABEL" = measured ]; then
    [ "$sum" = "$ATTENTION_SHA256" ] || die "$ATTENTION has sha256 $sum, not Vidur's $ATTENTION_SHA256"
    ORIGIN="Vidur's measured A100 profile (Git LFS oid sha256:$ATTENTION_SHA256)"
elif [ "$LABEL" = transcribed ]; then
    [ "$sum" = "$TRANSCRIBED_SHA256" ] || die "$ATTENTION has sha256 $sum, not the transcription's $TRANSCRIBED_SHA256"
    ORIGIN="the one-GPU rows of Vidur's measured A100 profile, shapes and medians transcribed from github sw5sh/cs378-assignment3 (python -m benchmarks.vidur_transcribed_profile)"
else
    expected=$(mktemp -d)
    trap 'rm -rf "$expected"' EXIT
    (cd "$FORGE" && ${PYTHON:-python3} -m benchmarks.vidur_attention_profile --out "$expected/attention.csv" >/dev/null)
    want=$(sha256sum "$expected/attention.csv" | cut -d' ' -f1)
    [ "$sum" = "$want" ] || die "$ATTENTION has sha256 $sum, not $want (what python -m benchmarks.vidur_attention_profile computes in $FORGE)"
    commit=$(git -C "$FORGE" rev-parse HEAD 2>/dev/null || echo unknown)
    ORIGIN="forge's clock.cost=operators A100 model (python -m benchmarks.vidur_attention_profile, forge $commit): NOT Vidur's measurements"
fi
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
printf 'label=%s\nsha256=%s\norigin=%s\n' "$LABEL" "$sum" "$ORIGIN" > "$SRC/ATTENTION_PROFILE"
git --git-dir="$MIRROR" rev-parse HEAD > "$SRC/MIRROR_COMMIT"
# the checkout's source is the vidur the venv imports
(cd "$SRC" && "$VENV/bin/python" -c "import vidur.main, os; assert vidur.main.__file__ == os.path.abspath('vidur/main.py')")
echo "vidur ready: cd $SRC && $VENV/bin/python -m vidur.main ... (source at $(cat "$SRC/MIRROR_COMMIT"); attention profile: $LABEL, sha256 $sum)"
