#!/usr/bin/env bash
# Check, on this machine, that the wheels fetch_wheels.sh made install offline into a fresh Python
# 3.12 virtual environment (the device's Python) and that forge then imports and composes a config
# (issue 39).
#
#   bash benchmarks/gpu/check_wheels_py312.sh [WHEELS]      # WHEELS: benchmarks/gpu/wheels
#
# The device already has numpy, pyyaml, packaging, requests and tqdm (the device tool's KINDS.md);
# their cp312 wheels are downloaded here as stand-ins (they do not travel), then everything installs
# with `pip install --no-index --no-deps`. Not checkable here: torch (a 3.12 CUDA torch is not
# fetched for this), so what imports torch is left to the device run; the config composed is the
# synthetic model's, which needs no torch. PYTHON312 names the interpreter (default: python3.12).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WHEELS=${1:-$HERE/wheels}
PY312=${PYTHON312:-python3.12}
"$PY312" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version'
TMP=$(mktemp -d -t forge-wheels-py312.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
"${PYTHON:-python3}" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi none --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$TMP/device" \
    numpy pyyaml packaging requests tqdm
"$PY312" -m venv "$TMP/venv"
"$TMP/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps \
    "$WHEELS"/*.whl "$TMP/device"/*.whl
cd "$TMP"
PYTHONPATH=$ROOT "$TMP/venv/bin/python" -c "
import sys
import antlr4, gguf, hydra, omegaconf, outlines_core, pydantic
import forge
import forge.server.generation  # LLM.generate's path: pydantic
from forge.config import compose_config
cfg = compose_config(['model=synthetic', 'clock=simulated', 'workload.num_requests=3'])
assert forge.__file__.startswith('$ROOT'), forge.__file__
print('python', sys.version.split()[0], '| hydra', hydra.__version__, '| omegaconf', omegaconf.__version__,
      '| gguf ok | composed', cfg.model._target_, cfg.workload.num_requests, 'requests')"
