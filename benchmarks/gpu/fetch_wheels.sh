#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels benchmarks/gpu/device_check.sh installs on the device
# machine (issue 39). That machine has Python 3.12, torch (CUDA 13), cupy-cuda13x, transformers,
# numpy, pyyaml, packaging, tqdm, requests, pytest... (the device tool's KINDS.md) and fetches
# nothing, so exactly what forge imports on the check's paths and it lacks travels as wheels:
# hydra-core, omegaconf, antlr4-python3-runtime (hydra's parser), gguf, outlines-core (the default
# structured-output backend, which config validation imports) and pydantic with its dependencies
# (LLM.generate goes through forge.server.generation); typing-extensions travels too, at the version
# pydantic needs, in case the device's is older. forge itself travels as the working tree.
#
#   bash benchmarks/gpu/fetch_wheels.sh [DEST]      # DEST: benchmarks/gpu/wheels (git-ignored)
#
# then carry DEST with the device call (`carry: ["benchmarks/gpu/wheels"]`). The script checks
# that every wheel is pure-Python or cp312, and that the working tree plus the wheels stay under
# the 64 MiB a device call carries.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DEST=${1:-$HERE/wheels}
PY=${PYTHON:-python3}
LIMIT_BYTES=$((64 * 1024 * 1024))
# Pinned within pyproject's ranges: the versions the CI machine runs.
BINARY=(hydra-core==1.3.8 omegaconf==2.3.1 gguf==0.19.0 outlines-core==0.2.14 pydantic==2.13.4 pydantic-core==2.46.4
    annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.16.0)
# omegaconf and hydra need antlr4-python3-runtime==4.9.*, published as a source archive only:
# built here into a pure-Python (py3-none-any) wheel.
SOURCE_ONLY=(antlr4-python3-runtime==4.9.3)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)

rm -rf "$DEST"
mkdir -p "$DEST"
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi none "${platform_args[@]}" \
    -d "$DEST" "${BINARY[@]}"
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$DEST" "${SOURCE_ONLY[@]}"

bad=0
for w in "$DEST"/*.whl; do
    case "$(basename "$w")" in
        *-py3-none-any.whl | *-py2.py3-none-any.whl | *-cp312-*.whl) ;;
        *) echo "not installable on the device's CPython 3.12: $w" >&2; bad=1 ;;
    esac
done
count=$(ls "$DEST"/*.whl | wc -l)
if [ "$count" -ne $((${#BINARY[@]} + ${#SOURCE_ONLY[@]})) ]; then
    echo "expected $((${#BINARY[@]} + ${#SOURCE_ONLY[@]})) wheels in $DEST, found $count" >&2
    bad=1
fi
# Which commit the wheels were fetched for (the device copy may have no .git).
git -C "$ROOT" rev-parse HEAD >"$DEST/SOURCE_COMMIT" 2>/dev/null || echo unknown >"$DEST/SOURCE_COMMIT"

# What a device call carries: tracked + untracked-not-ignored files, plus the wheels.
tree_bytes=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard 2>/dev/null \
    | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
wheel_bytes=$(du -sb "$DEST" | cut -f1)
total=$((tree_bytes + wheel_bytes))
echo "wheels: $count in $DEST ($((wheel_bytes / 1024)) KiB); working tree $((tree_bytes / 1024)) KiB;" \
    "carried total $((total / 1024)) KiB of $((LIMIT_BYTES / 1024)) KiB"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
    echo "over the 64 MiB a device call carries" >&2
    bad=1
fi
exit "$bad"
