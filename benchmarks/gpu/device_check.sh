#!/usr/bin/env bash
# forge's CUDA backend on a real GPU, in one command (issue 39). On the device machine, in the
# repository root, with benchmarks/gpu/wheels carried (bash benchmarks/gpu/fetch_wheels.sh first):
#
#   bash benchmarks/gpu/device_check.sh            # writes under $OUT, prints a summary (<= 8 min)
#   bash benchmarks/gpu/device_check.sh --dry-run  # the same steps on the CPU execution layer
#
# The device tool's call: run(command="bash benchmarks/gpu/device_check.sh",
# carry=["benchmarks/gpu/wheels"], timeout_s=560); then commit $OUT's files under
# reports/gpu/<date>-<gpu>/ with the command and commit (issue 39).
#
# Steps, each under its own time limit (a hang costs that step only; later steps still run and the
# whole stays within DEVICE_CHECK_BUDGET_S, default 480 s; DEVICE_CHECK_TIME_SCALE multiplies both):
#   install    the carried wheels into a temporary prefix, offline; import forge, compose a config
#   machine    GPU, driver, CUDA, nvcc, compute-sanitizer, torch, CuPy          -> machine.txt
#   pytest-gpu tests/test_cuda_kernels.py -m "gpu and not slow": every kernel x dtype against the
#              torch oracle, graphs on/off, int8/fp8 KV, engine greedy tokens backend=cuda ==
#              backend=torch (realmodel tests left out: SmolLM2's 98 MB GGUF cannot travel)
#                                                                                 -> pytest_gpu.log
#   throughput benchmarks/gpu_throughput.py, SmolLM2-135M's shapes with random weights: forge
#              cuda vs torch vs transformers, decode tok/s at batch 1/8/64/256, batch-1 fraction of
#              the copy-bandwidth floor, a 64-request workload   -> throughput.json, throughput.log
#   memcheck, racecheck, synccheck
#              compute-sanitizer over a reduced kernel-test set                   -> sanitizer.log
#   pytest-full the rest of the shape matrix (-m "gpu and slow"), last, in what budget is left
#                                                                            -> pytest_gpu_full.log
# --dry-run: CPU execution layer (backend.runtime=cpu), no compute-sanitizer (the same pytest
# commands without it), tiny shapes and the toy model; output in a temporary folder unless
# DEVICE_CHECK_OUT names one. Every step passes here, so the script cannot rot between loans.
# Exit status: 0 when every step passed.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DRY=0
case "${1:-}" in
    --dry-run) DRY=1 ;;
    "") ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
WHEELS=${DEVICE_CHECK_WHEELS:-$HERE/wheels}
# The dry run's limits are 4x the device's: a loaded CI machine must not time a step out.
SCALE=${DEVICE_CHECK_TIME_SCALE:-$([ "$DRY" = 1 ] && echo 4 || echo 1)}
BUDGET=${DEVICE_CHECK_BUDGET_S:-$((480 * SCALE))}
if [ -n "${DEVICE_CHECK_OUT:-}" ]; then
    RESULTS=$DEVICE_CHECK_OUT
elif [ "$DRY" = 0 ] && [ -n "${OUT:-}" ]; then
    RESULTS=$OUT
else
    RESULTS=$(mktemp -d -t forge-device-check.XXXXXX)
fi
mkdir -p "$RESULTS"
WORK=$(mktemp -d -t forge-device-check-prefix.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
SUMMARY=$RESULTS/summary.txt
: >"$SUMMARY"
START=$(date +%s)
FAILED=0
STEPS=0
KERNEL_TESTS=tests/test_cuda_kernels.py
SANITIZED="rms_norm or silu_mul or reshape_and_cache or decode_attention or prefill_attention_with_cached_prefix \
or gemv or graph_replay_equals_eager"
SHARED_MEMORY="rms_norm or argmax or decode_attention or prefill_attention_with_cached_prefix"
if [ "$DRY" = 1 ]; then
    MODE=dry-run
    GPU_MARK="not gpu and not slow and not realmodel"
    PYTEST_K="test_rms_norm or test_engine_greedy_equals_torch_backend"
    FULL_MARK="slow and not gpu and not realmodel" FULL_K="test_rms_norm and 1-64 and dtype0"
    MEMCHECK_K="test_silu_mul and dtype0" RACECHECK_K="test_silu_mul and dtype1" SYNCCHECK_K="test_silu_mul and dtype2"
    SANITIZER_MARK=$GPU_MARK
    THROUGHPUT=(--device cpu --model tiny --dtype float32 --batches 1 2 --batch-prompt-len 8 --batch-tokens 3
        --copy-mib 8 --num-requests 3 --min-len 4 --max-len 8 --max-num-seqs 3 --kv-gib 0.05 --hf-batch-size 2
        --only batch-forge-cuda batch-forge-torch batch-hf bandwidth forge-cuda forge-torch hf-generate)
else
    MODE=device
    GPU_MARK="gpu and not slow and not realmodel"
    PYTEST_K=""
    FULL_MARK="gpu and slow and not realmodel" FULL_K=""
    MEMCHECK_K=$SANITIZED RACECHECK_K=$SHARED_MEMORY SYNCCHECK_K=$SHARED_MEMORY
    SANITIZER_MARK="gpu and not slow and not realmodel"
    THROUGHPUT=(--device cuda --model smollm2-shape --dtype bfloat16 --batches 1 8 64 256 --batch-prompt-len 128
        --batch-tokens 64 --num-requests 64 --min-len 64 --max-len 256 --max-num-seqs 64 --kv-gib 8
        --hf-batch-size 64)
fi
export PY ROOT WORK WHEELS RESULTS DRY KERNEL_TESTS GPU_MARK PYTEST_K SANITIZER_MARK
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

install_step() {
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        local wheels=("$WHEELS"/*.whl)
        if [ "$DRY" = 1 ] && ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
            echo "dry run on $("$PY" -V): the pure-Python wheels only (the cp312 ones are for the device)"
            wheels=("$WHEELS"/*-none-any.whl)
        fi
        "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
            --target "$WORK/site" "${wheels[@]}" || return 1
        printf '%s\n' "${wheels[@]##*/}"
    elif [ "$DRY" = 0 ]; then
        echo "no wheels in $WHEELS: run benchmarks/gpu/fetch_wheels.sh and carry benchmarks/gpu/wheels"
        return 1
    else
        echo "no wheels in $WHEELS: the dry run checks imports from this environment"
    fi
    "$PY" -c "
import forge, gguf, hydra, omegaconf, outlines_core, pydantic
import forge.server.generation  # LLM.generate's path
from forge.config import compose_config
cfg = compose_config(['model=tiny', 'backend=cuda', 'backend.runtime=cpu'])
print('forge from', forge.__file__, '| hydra', hydra.__version__, '| omegaconf', omegaconf.__version__)
print('composed backend:', cfg.backend._target_, 'runtime', cfg.backend.runtime)"
}

machine_step() {
    echo "date: $(date -u +%FT%TZ)  mode: $([ "$DRY" = 1 ] && echo dry-run || echo device)"
    local dirty=""
    [ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ] && dirty=" (with uncommitted changes)"
    echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || cat "$WHEELS/SOURCE_COMMIT" 2>/dev/null || echo unknown)$dirty"
    echo "host: $(uname -srm), $(nproc) CPUs"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    else
        echo "nvidia-smi: not on PATH"
    fi
    for tool in nvcc compute-sanitizer; do
        if command -v "$tool" >/dev/null; then
            echo "$tool: $("$tool" --version | grep -iE 'release|version' | tail -1)"
        else
            echo "$tool: not on PATH"
        fi
    done
    "$PY" "$ROOT/benchmarks/gpu/machine.py" "$([ "$DRY" = 1 ] && echo cpu || echo cuda)"
}

# pytest over the kernel tests; passes only when tests ran and none was skipped (a GPU test that
# skips means no GPU or no CuPy, which is a failure here, not a pass).
kernel_tests() {  # MARK K [wrapper...]
    local mark=$1 k=$2
    shift 2
    local log=$WORK/pytest.$$.log
    "$@" "$PY" -m pytest "$ROOT/$KERNEL_TESTS" -m "$mark" ${k:+-k "$k"} -q -p no:cacheprovider -rfEs \
        -o addopts="" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    local last
    last=$(grep -E "(passed|failed|error|skipped|no tests ran)" "$log" | tail -1)
    [ "$rc" = 0 ] || return "$rc"
    case "$last" in *skipped* | *"no tests ran"* | "") echo "tests skipped or none ran: $last"; return 3 ;; esac
}

sanitizer() {  # TOOL K
    local tool=$1 k=$2
    if [ "$DRY" = 1 ]; then
        echo "dry run: the $tool step's tests without compute-sanitizer"
        kernel_tests "$SANITIZER_MARK" "$k"
        return
    fi
    local extra=()
    [ "$tool" = memcheck ] && extra=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    kernel_tests "$SANITIZER_MARK" "$k" "${extra[@]}" compute-sanitizer --tool "$tool" --error-exitcode 86 \
        --print-limit 30 --target-processes all
}

throughput_step() {
    "$PY" -m benchmarks.gpu_throughput "$@" --out "$RESULTS/throughput.json"
}

export -f install_step machine_step kernel_tests sanitizer throughput_step

# step NAME LIMIT_S LOGFILE COMMAND...: run COMMAND (a function above) under a time limit cut to
# what is left of the budget; record pass / fail (rc) / timeout and the seconds taken.
step() {
    local name=$1 limit=$(($2 * SCALE)) log=$3
    shift 3
    local left=$((BUDGET - ($(date +%s) - START)))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        record "$name" "not-run" 0 "budget of ${BUDGET}s spent"
        return
    fi
    echo "== $name (limit ${limit}s) $(date -u +%TZ)" | tee -a "$log"
    local t0 rc status
    t0=$(date +%s)
    (cd "$ROOT" && timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@") >>"$log" 2>&1
    rc=$?
    case $rc in
        0) status=pass ;;
        124 | 137) status=timeout ;;
        *) status=fail ;;
    esac
    if [ "$status" = fail ] && grep -q "Device not supported" "$log"; then
        status=unsupported
    fi
    record "$name" "$status" $(($(date +%s) - t0)) "rc=$rc log=$(basename "$log")"
}

record() {  # NAME STATUS SECONDS NOTE
    STEPS=$((STEPS + 1))
    [ "$2" = pass ] || FAILED=$((FAILED + 1))
    printf 'STEP %-11s %-11s %4ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$SUMMARY"
}

step install 45 "$RESULTS/install.log" install_step
export PYTHONPATH="$WORK/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
step machine 30 "$RESULTS/machine.txt" machine_step
step pytest-gpu 90 "$RESULTS/pytest_gpu.log" kernel_tests "$GPU_MARK" "$PYTEST_K"
step throughput 150 "$RESULTS/throughput.log" throughput_step "${THROUGHPUT[@]}"
step memcheck 60 "$RESULTS/sanitizer.log" sanitizer memcheck "$MEMCHECK_K"
step racecheck 40 "$RESULTS/sanitizer.log" sanitizer racecheck "$RACECHECK_K"
step synccheck 30 "$RESULTS/sanitizer.log" sanitizer synccheck "$SYNCCHECK_K"
step pytest-full 480 "$RESULTS/pytest_gpu_full.log" kernel_tests "$FULL_MARK" "$FULL_K"

{
    echo "-- machine"
    grep -vE '^==' "$RESULTS/machine.txt" 2>/dev/null | head -20
    echo "-- throughput ($([ "$DRY" = 1 ] && echo 'dry run: toy model on the CPU, not a measurement' || echo "$RESULTS/throughput.json"))"
    sed -n '/^summary:$/,/^wrote /p' "$RESULTS/throughput.log" 2>/dev/null | sed '1d;$d' 
    echo "device_check ($MODE): $((STEPS - FAILED)) of $STEPS steps passed, $(($(date +%s) - START)) s; results in $RESULTS"
} | tee -a "$SUMMARY"
[ "$FAILED" = 0 ]
